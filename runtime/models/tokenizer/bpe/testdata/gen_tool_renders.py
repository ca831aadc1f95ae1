"""Writes tool_renders.json: what transformers' apply_chat_template renders
for TestChatTemplateTools' conversations, by Python's jinja2 set up as
transformers sets it up (trim_blocks, lstrip_blocks, loopcontrols; tojson
as json.dumps(ensure_ascii=False); raise_exception). Run from this folder:
python3 gen_tool_renders.py (jinja2 3.1)."""
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOLS = [{"type": "function", "function": {
    "name": "get_weather",
    "description": "Météo: the weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]


def call(id, name, args):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


CASES = {
    # the tools, a call, its result, the reply to come
    "one call": [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"unit": "c", "city": "Paris"})]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
    ],
    # no system message: the template's default one (Qwen) or none (Llama)
    "no system": [
        {"role": "user", "content": "Weather in Rome?"},
    ],
}
# Qwen calls several tools at once; Llama 3.1's template refuses that.
QWEN_ONLY = {
    "two calls": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            call("call_1", "get_weather", {"city": "Paris"}), call("call_2", "get_weather", {"city": "Rome", "unit": "f"})]},
        {"role": "tool", "content": "21", "tool_call_id": "call_1"},
        {"role": "tool", "content": "64", "tool_call_id": "call_2"},
    ],
}


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def render(src, messages, tools):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src).render(messages=messages, tools=tools, add_generation_prompt=True,
                                       bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")


out = {}
for name, path, cases in [("qwen2.5", "qwen2_5_chat_template.jinja", {**CASES, **QWEN_ONLY}),
                          ("llama3.1", "llama3_1_chat_template.jinja", CASES)]:
    src = open(path).read()
    for case, msgs in cases.items():
        out[name + "/" + case] = {"messages": msgs, "tools": TOOLS, "want": render(src, msgs, TOOLS)}
with open("tool_renders.json", "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
