"""Check a script's command line without running it: `python scripts/check_flags.py SCRIPT [FLAGS...]`.

Runs SCRIPT as __main__ up to its first `ArgumentParser.parse_args`, which parses FLAGS as the script would
(unknown flags, bad types and choices stop it with the script's own error), then exits 0 before any work. Used by
`scripts/gpu_session.sh --dry_run`, so that GPU minutes are never spent on a typo. A script that ends without
parsing any flags is reported as an error: its flags were not checked.
"""
import argparse
import runpy
import sys
from pathlib import Path


class FlagsChecked(BaseException):  # not an Exception: a script's own `except Exception` must not catch it
    pass


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    script = Path(sys.argv[1])
    if not script.is_file():
        raise SystemExit(f"check_flags: no script {script}")
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        parse_args(parser, args, namespace)
        raise FlagsChecked

    argparse.ArgumentParser.parse_args = parse_then_stop
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))  # as `python SCRIPT` puts the script's folder first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except FlagsChecked:
        print(f"check_flags: {script} accepts {' '.join(sys.argv[1:]) or 'no flags'}")
        return
    raise SystemExit(f"check_flags: {script} ended without parsing its flags; nothing was checked")


if __name__ == "__main__":
    main()
