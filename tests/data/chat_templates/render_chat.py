#!/usr/bin/env python3
"""Reference renderer: a chat template through Python jinja2, set up as transformers'
apply_chat_template sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loop controls, a `generation` block that renders its body, transformers' tojson,
raise_exception and strftime_now). Same flags and output as `moebatch render-chat`:

  render_chat.py --template FILE --messages FILE.json [--tools FILE.json]
                 [--add-generation-prompt] [--bos-token S] [--eos-token S]
                 [--kwargs JSON] [--date YYYY-MM-DD]

prints one rendering with no added newline; a template error (raise_exception included)
exits 2 with the message on stderr. With --batch FILE (a JSON list of cases, each
{template, messages, tools?, add_generation_prompt?, bos_token?, eos_token?, kwargs?, date?})
it prints a JSON list of {"text": ...} or {"error": ...}, one per case, in one process.
"""
import argparse
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_compiled = {}


def render(case):
    """The rendering of one case, or raises."""
    date = case.get("date")
    key = (case["template"], date)
    template = _compiled.get(key) if date else None
    if template is None:
        now = (datetime.datetime.strptime(date, "%Y-%m-%d") if date
               else datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None))
        template = make_env(now).from_string(case["template"])
        if date:
            _compiled[key] = template
    variables = {}
    for token in ("bos_token", "eos_token"):
        if case.get(token) is not None:
            variables[token] = case[token]
    variables.update(case.get("kwargs") or {})
    return template.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                           add_generation_prompt=bool(case.get("add_generation_prompt")),
                           **variables)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--template")
    p.add_argument("--messages")
    p.add_argument("--tools")
    p.add_argument("--add-generation-prompt", action="store_true")
    p.add_argument("--bos-token")
    p.add_argument("--eos-token")
    p.add_argument("--kwargs")
    p.add_argument("--date")
    p.add_argument("--batch")
    a = p.parse_args()
    if a.batch:
        with open(a.batch, encoding="utf-8") as f:
            cases = json.load(f)
        out = []
        for case in cases:
            try:
                out.append({"text": render(case)})
            except Exception as e:  # noqa: BLE001 - every failure is reported per case
                out.append({"error": str(e), "raised": type(e) is jinja2.exceptions.TemplateError})
        sys.stdout.write(json.dumps(out, ensure_ascii=False))
        return 0
    if not a.template or not a.messages:
        p.print_usage(sys.stderr)
        return 2
    with open(a.template, encoding="utf-8", newline="") as f:
        case = {"template": f.read()}
    with open(a.messages, encoding="utf-8") as f:
        case["messages"] = json.load(f)
    if a.tools:
        with open(a.tools, encoding="utf-8") as f:
            case["tools"] = json.load(f)
    case.update(add_generation_prompt=a.add_generation_prompt, bos_token=a.bos_token,
                eos_token=a.eos_token, kwargs=json.loads(a.kwargs) if a.kwargs else None,
                date=a.date)
    try:
        text = render(case)
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
