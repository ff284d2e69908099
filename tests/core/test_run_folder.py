"""The run folder's lock: a second process cannot train into a folder another holds, and can once that ends; a
released lock leaves nothing in the folder."""
import subprocess
import sys
from pathlib import Path

import pytest

from languini import run_folder

REPO = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; from languini import run_folder; run_folder.lock(sys.argv[1]); print('held', flush=True); " \
       "time.sleep(60)"


def test_a_folder_held_by_another_process_is_refused_until_that_process_ends(tmp_path):
    run_dir = tmp_path / "runs" / "gpt_2m"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FileExistsError, match=rf"in use by another run \(process {holder.pid}\).*--run_name"):
            run_folder.lock(run_dir)
    finally:
        holder.kill()
        holder.wait()
    with run_folder.locks_released_on_exit():
        run_folder.lock(run_dir)  # the lock went with its process
        run_folder.lock(run_dir)  # and this process may ask again


def test_a_run_in_a_process_that_goes_on_releases_its_folder_when_it_ends(tmp_path):
    run_dir = tmp_path / "runs" / "gpt_2m"
    run_dir.mkdir(parents=True)
    with run_folder.locks_released_on_exit():
        run_folder.lock(run_dir)
    assert list(run_dir.iterdir()) == []
    probe = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(60)", "pass"), str(run_dir)],
                           capture_output=True, text=True, cwd=REPO)
    assert probe.returncode == 0 and probe.stdout.strip() == "held", probe.stderr
