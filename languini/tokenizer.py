"""SentencePiece BPE with an exact round trip, and the byte length of every token (for normalised perplexity)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import sentencepiece as spm

NEWLINE = "\n"


def train_bpe(sentences: Iterable[str], model_path: str | os.PathLike, vocab_size: int,
              max_sentences: int = 3_000_000) -> None:
    """Train a BPE model whose decode(encode(text)) == text for any UTF-8 text."""
    model_path = Path(model_path)
    spm.set_random_generator_seed(1234)  # sentence sampling: same corpus, same tokenizer
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(model_path.with_suffix("")),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,  # any character outside the vocabulary still round-trips as bytes
        normalization_rule_name="identity",  # no NFKC: the text must come back unchanged
        add_dummy_prefix=False,  # so the decoded text has no invented leading space
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        user_defined_symbols=[NEWLINE],  # training sees lines, but books are encoded whole
        character_coverage=0.9999,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        max_sentence_length=1 << 16,
        num_threads=os.cpu_count() or 1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,  # eos (2) is Languini's end-of-document token
        minloglevel=2,
    )


def load(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(path))


def bytes_per_token(sp: spm.SentencePieceProcessor) -> np.ndarray:
    """UTF-8 bytes each token adds to the decoded text: 1 for byte tokens, 0 for control tokens.

    Exact for models without a dummy prefix: those train_bpe trains and the official Languini vocabularies
    (whose end-of-document token <D> is a user-defined piece that decodes to 3 bytes, "<D>"). With a dummy
    prefix the decoder drops one leading space per text, so counts would be 1 byte high per document.
    """
    table = np.zeros(sp.get_piece_size(), dtype=np.int64)
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            continue
        table[i] = 1 if sp.is_byte(i) else len(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return table
