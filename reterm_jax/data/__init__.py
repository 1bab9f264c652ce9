"""Chat rendering, loss masks, the ReTerm-10K schema and Grain pipelines.

    from reterm_jax.data import encode_example, load_tokenizer
    ex = encode_example(row, load_tokenizer(dir))   # ex.tokens int32[T], ex.loss_mask bool[T]
"""
from reterm_jax.data.chat import (BASH_TOOL, EncodedExample, Piece, check_chat_template, encode_example, render,
                                  render_text)
from reterm_jax.data.schema import RowError, ValidationReport, validate_row, validate_rows
from reterm_jax.data.tokenizer import TINY_TOKENIZER_DIR, SpecialIds, load_tokenizer, special_ids
from reterm_jax.data.sources import load_and_validate, load_rows, save_rows
from reterm_jax.data.pipeline import LengthReport, PipelineStats, length_report, sft_dataset

__all__ = [
    "BASH_TOOL", "EncodedExample", "Piece", "check_chat_template", "encode_example", "render", "render_text",
    "RowError", "ValidationReport", "validate_row", "validate_rows",
    "TINY_TOKENIZER_DIR", "SpecialIds", "load_tokenizer", "special_ids",
    "load_and_validate", "load_rows", "save_rows", "PipelineStats", "sft_dataset", "LengthReport", "length_report",
]
