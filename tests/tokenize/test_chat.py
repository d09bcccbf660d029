"""Chat templates render exactly as transformers' apply_chat_template(..., tokenize=False)."""

from __future__ import annotations

import datetime
import re
import warnings

import pytest

from pyagent_ref.tokenize import (
    ChatTemplateError,
    HFTokenizer,
    check_messages,
    load_chat_templates,
    render_chat_template,
    select_chat_template,
)

from .helpers import write_hf_dir

SIMPLE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Block tags on their own lines: trim_blocks / lstrip_blocks decide the whitespace.
TOOLS = """\
{%- if tools %}
<|im_start|>system
You can call these tools:
    {% for tool in tools %}
{{ tool | tojson(indent=2) }}
    {% endfor %}
<|im_end|>
{% endif %}
{% for message in messages %}
    {% if message.role == 'assistant' and message.tool_calls is defined %}
<|im_start|>assistant
        {% if message.content is defined %}{{ message.content }}{% endif %}
        {% for call in message.tool_calls %}
<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments | tojson }}}</tool_call>
        {% endfor %}
<|im_end|>
    {% elif message.role == 'tool' %}
<|im_start|>tool
{{ message.content }}<|im_end|>
    {% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

DOCUMENTS = """\
{{ bos_token }}
{%- if documents %}
<documents>
  {% for doc in documents %}
  [{{ loop.index0 }}] {{ doc.title }}: {{ doc.text }}{% if not loop.last %}
{% endif %}
  {% endfor %}

</documents>
{% endif %}
{% for message in messages %}
{{ message.role | upper }}: {{ message.content | trim }}
{% endfor %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}"""

STRICT = """\
{% if messages[0].role == 'system' %}{% set rest = messages[1:] %}{% else %}\
{% set rest = messages %}{% endif %}
{% for message in rest %}
    {% if (message.role == 'user') != (loop.index0 % 2 == 0) %}
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
[{{ message.role }}] {{ message.content }}
{% endfor %}"""

# loopcontrols, namespace, strftime_now, {% generation %}, an extra variable, tojson options.
FEATURES = """\
{% set ns = namespace(count=0) %}
{% for message in messages %}
    {% if message.role == 'system' %}{% continue %}{% endif %}
    {% if ns.count >= 3 %}{% break %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    {% if message.role == 'assistant' %}
{% generation %}A: {{ message.content }}{{ eos_token }}{% endgeneration %}
    {% else %}
U: {{ message.content }}
    {% endif %}
{% endfor %}
{% set who = 'outer' %}{% generation %}{% set who = 'inner' %}{% endgeneration %}\
who={{ who }}; Year {{ strftime_now('%Y') }}; thinking={{ enable_thinking | default(true) }}; \
meta={{ meta | tojson(separators=(',', ':'), sort_keys=true) }}
{% if add_generation_prompt %}A:{% endif %}"""

CONVERSATION = [
    {"role": "system", "content": "Tu es un assistant serviable. 🤖"},
    {"role": "user", "content": "Quel temps fait-il à Zürich ? 日本語も"},
    {"role": "assistant", "content": "Il fait beau. ☀️"},
    {"role": "user", "content": "  Merci !  "},
]

TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville — température en °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "ex. 東京"}},
                "required": ["city"],
            },
        },
    }
]

TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Tōkyō?"},
    {
        "role": "assistant",
        "content": None,  # as the OpenAI API sends it; dropped before rendering
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}}
        ],
    },
    {"role": "tool", "content": '{"temp": 21}'},
]

DOCS = [
    {"title": "Zürich", "text": "Größte Stadt der Schweiz."},
    {"title": "東京", "text": "日本の首都。"},
]

CASES = {
    "simple": (SIMPLE, CONVERSATION, {}),
    "tools and tojson": (TOOLS, TOOL_CONVERSATION, {"tools": TOOL_SCHEMAS}),
    "tools absent": (TOOLS, CONVERSATION, {}),
    "documents": (DOCUMENTS, CONVERSATION, {"documents": DOCS}),
    "strict, valid": (STRICT, CONVERSATION, {}),
    "features": (
        FEATURES,
        CONVERSATION * 2,
        {"enable_thinking": False, "meta": {"b": [1, "é"], "a": None}},
    ),
}


@pytest.fixture(scope="module")
def pair(bpe):
    """(ours, transformers') on the same backend and special tokens."""
    transformers = pytest.importorskip("transformers")
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    ours = HFTokenizer(bpe, special_tokens=specials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, **specials)
    return ours, ref


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_transformers(pair, case, add_generation_prompt):
    ours, ref = pair
    template, messages, kwargs = CASES[case]
    ref.chat_template = template
    expected = ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    got = ours.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=add_generation_prompt, **kwargs
    )
    assert got == expected
    ids = ours.apply_chat_template(
        messages,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        **kwargs,
    )
    assert ids == ref.encode(expected, add_special_tokens=False)


def test_features_template_really_uses_its_features(pair):
    ours, _ = pair
    text = ours.apply_chat_template(
        CONVERSATION * 2, chat_template=FEATURES, enable_thinking=False, meta={"b": 1, "a": "é"}
    )
    assert text.count("U: ") + text.count("A: ") == 3  # break after 3, system skipped
    assert f"Year {datetime.date.today().year}" in text
    assert 'meta={"a":"é","b":1}' in text
    assert "thinking=False" in text
    assert "who=outer" in text  # {% generation %} has its own scope
    assert text.endswith("A:")


def test_raise_exception_like_transformers(pair):
    ours, ref = pair
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    ref.chat_template = STRICT
    jinja2 = pytest.importorskip("jinja2")
    with pytest.raises(jinja2.TemplateError) as ref_err:
        ref.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ChatTemplateError) as our_err:
        ours.apply_chat_template(bad, chat_template=STRICT)
    assert str(our_err.value) == str(ref_err.value)
    assert str(our_err.value).startswith("Conversation roles must alternate user/assistant")
    assert isinstance(our_err.value, ValueError)


def test_sandbox_and_errors():
    with pytest.raises(ChatTemplateError, match="syntax error at line 1"):
        render_chat_template("{% for %}", [{"role": "user", "content": "x"}])
    # The immutable sandbox forbids mutating lists and reaching into internals.
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        render_chat_template("{{ messages.append(1) }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        render_chat_template("{{ messages.__class__.__mro__ }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages must not be empty, got \[\]"):
        render_chat_template(SIMPLE, [])
    with pytest.raises(TypeError, match=r"messages\[1\] must be a dict, got str"):
        render_chat_template(SIMPLE, [{"role": "user", "content": "x"}, "hello"])
    with pytest.raises(TypeError, match=r"tools\[0\] must be a dict"):
        render_chat_template(SIMPLE, [{"role": "user"}], tools=[print])
    with pytest.raises(TypeError, match=r"messages\[0\]\['extra'\]: chat template inputs"):
        render_chat_template(SIMPLE, [{"role": "user", "content": "x", "extra": object()}])
    with pytest.raises(TypeError, match="add_generation_prompt must be a bool"):
        render_chat_template(SIMPLE, [{"role": "user"}], add_generation_prompt="yes")


@pytest.mark.parametrize(
    ("messages", "error", "message"),
    [
        ("hello", TypeError, "messages must be a list of dicts, got str"),
        ({"role": "user", "content": "x"}, TypeError, "messages must be a list of dicts, got dict"),
        (
            [{"role": "user", "content": "x"}, {"content": "y"}],
            ValueError,
            "messages[1] has no 'role' key; its keys are ['content']",
        ),
        (
            [{"role": None, "content": "x"}],
            TypeError,
            "messages[0]['role'] must be a str, got None",
        ),
        ([{"role": 1, "content": "x"}], TypeError, "messages[0]['role'] must be a str, got 1"),
        (
            [{"role": "user", "content": 3}],
            TypeError,
            "messages[0]['content'] must be a str, a list of content parts or None, got int",
        ),
        (
            [{"role": "user", "content": {"type": "text", "text": "x"}}],
            TypeError,
            "messages[0]['content'] must be a str, a list of content parts or None, got dict",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x"}, "y"]}],
            TypeError,
            "messages[0]['content'][1] must be a dict, got str: 'y'",
        ),
        (
            [{"role": "assistant", "tool_calls": "get_weather()"}],
            TypeError,
            "messages[0]['tool_calls'] must be a list of dicts or None, got str",
        ),
    ],
    ids=[
        "str",
        "dict",
        "no role",
        "role None",
        "role int",
        "content int",
        "content dict",
        "content part str",
        "tool_calls str",
    ],
)
def test_malformed_conversations_are_named(hf_tok, messages, error, message):
    with pytest.raises(error, match=re.escape(message)):
        check_messages(messages)
    with pytest.raises(error, match=re.escape(message)):
        hf_tok.apply_chat_template(messages, chat_template=SIMPLE)


def test_well_formed_conversations_render():
    parts = [{"type": "text", "text": "look: "}, {"type": "image"}]
    template = (
        "{% for m in messages %}{{ m.role }}:"
        "{% if m.content is string %}{{ m.content }}"
        "{% elif m.content is defined %}"
        "{% for p in m.content %}{{ p.text if p.type == 'text' else '<' ~ p.type ~ '>' }}"
        "{% endfor %}{% endif %}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }}]{% endfor %};{% endfor %}"
    )
    messages = (
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None, "tool_calls": TOOL_CONVERSATION[1]["tool_calls"]},
        {"role": "tool", "content": "21"},
        {"role": "assistant"},
    )
    assert render_chat_template(template, messages) == (
        "user:look: <image>;assistant:[get_weather];tool:21;assistant:;"
    )
    assert check_messages(messages)[1] == {
        "role": "assistant",
        "tool_calls": TOOL_CONVERSATION[1]["tool_calls"],
    }


def test_messages_are_not_modified():
    messages = [{"role": "user", "content": "x", "extra": None}]
    render_chat_template("{{ messages[0].keys() | list | length }}", messages)
    assert messages == [{"role": "user", "content": "x", "extra": None}]
    assert render_chat_template("{{ messages[0] | length }}", messages) == "2"


def test_select_chat_template():
    named = {"default": "D", "tool_use": "T", "rag": "R"}
    assert select_chat_template(named) == "D"
    assert select_chat_template(named, has_tools=True) == "T"
    assert select_chat_template(named, "rag") == "R"
    assert select_chat_template(named, "{{ 'inline' }}") == "{{ 'inline' }}"
    with pytest.raises(ValueError, match=r"no 'default' template; pass one of \['rag'\]"):
        select_chat_template({"rag": "R"})
    with pytest.raises(ValueError, match="has no chat template"):
        select_chat_template({})


def test_template_files_and_precedence(bpe, tmp_path):
    config = {
        "bos_token": "<s>",
        "chat_template": [
            {"name": "default", "template": "from config"},
            {"name": "tool_use", "template": "tools from config"},
        ],
    }
    model_dir = write_hf_dir(tmp_path / "m", bpe, config)
    assert load_chat_templates(model_dir, config) == {
        "default": "from config",
        "tool_use": "tools from config",
    }
    (model_dir / "chat_template.json").write_text('{"chat_template": "from json"}')
    assert load_chat_templates(model_dir, config)["default"] == "from json"
    (model_dir / "chat_template.jinja").write_text("{{ bos_token }}from jinja")
    (model_dir / "additional_chat_templates").mkdir()
    (model_dir / "additional_chat_templates" / "rag.jinja").write_text("rag")
    tok = HFTokenizer.from_pretrained(model_dir)
    assert tok.chat_templates == {
        "default": "{{ bos_token }}from jinja",
        "tool_use": "tools from config",
        "rag": "rag",
    }
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == "<s>from jinja"
    assert tok.apply_chat_template(messages, tools=[]) == "tools from config"
    assert tok.apply_chat_template(messages, chat_template="rag") == "rag"
    (model_dir / "chat_template.json").write_text('{"template": "x"}')
    with pytest.raises(ValueError, match="must be an object with a 'chat_template' key"):
        load_chat_templates(model_dir, config)
    with pytest.raises(ValueError, match=r"chat_template\[0\] must be \{'name': str"):
        load_chat_templates(tmp_path, {"chat_template": [{"name": "x"}]})


def test_transformers_reads_the_same_template_files(bpe, tmp_path):
    transformers = pytest.importorskip("transformers")
    model_dir = write_hf_dir(
        tmp_path / "m",
        bpe,
        {"bos_token": "<s>", "chat_template": "old"},
        files={"chat_template.jinja": SIMPLE},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    ours = HFTokenizer.from_pretrained(model_dir)
    assert ours.apply_chat_template(CONVERSATION) == ref.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )
