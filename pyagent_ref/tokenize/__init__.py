"""Tokenizers, chat templates, incremental detokenization and stop handling.

* `Tokenizer`: the protocol the engine programs against, with three backends:
  `HFTokenizer` (``tokenizer.json`` via the `tokenizers` library),
  `TiktokenTokenizer` (a ``*.tiktoken`` rank file via the optional `tiktoken` package) and
  `BPETokenizer` (``tokenizer.json`` via `BytePairEncoding`, byte-level BPE written out in
  `tokenize.bpe`); `load_tokenizer(model_dir, backend=...)` picks the one a checkpoint needs.
* `render_chat_template`: HF chat templates rendered the way transformers renders them;
  `check_messages` checks a conversation first, naming the message at fault.
* `IncrementalDetokenizer`: generated ids in, text deltas out, never a broken character.
* `StopChecker`: stop strings (across deltas) and stop token ids on streamed text.

`TiktokenTokenizer` is importable without `tiktoken`; building one needs it.
"""

from .bpe import BPETokenizer, BytePairEncoding, UnsupportedTokenizerError
from .chat import (
    ChatTemplateError,
    check_messages,
    compile_chat_template,
    load_chat_templates,
    render_chat_template,
    select_chat_template,
)
from .detokenizer import IncrementalDetokenizer
from .hf import HFTokenizer
from .loader import TOKENIZER_BACKENDS, load_tokenizer
from .protocol import Message, Tokenizer
from .stop import StopChecker, StopResult, find_stop
from .tiktoken_backend import TiktokenTokenizer, read_tiktoken_ranks

__all__ = [
    "TOKENIZER_BACKENDS",
    "BPETokenizer",
    "BytePairEncoding",
    "ChatTemplateError",
    "HFTokenizer",
    "IncrementalDetokenizer",
    "Message",
    "StopChecker",
    "StopResult",
    "TiktokenTokenizer",
    "Tokenizer",
    "UnsupportedTokenizerError",
    "check_messages",
    "compile_chat_template",
    "find_stop",
    "load_chat_templates",
    "load_tokenizer",
    "read_tiktoken_ranks",
    "render_chat_template",
    "select_chat_template",
]
