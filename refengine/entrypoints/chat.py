"""Chat prompts: the model folder's own chat template when it has one, else ChatML as Qwen2 uses it.

A folder's template is read from `chat_template.jinja` or the `chat_template` key of `tokenizer_config.json` and
rendered in a sandboxed Jinja environment, as transformers' `apply_chat_template` does. Presets (random weights,
the Qwen BPE) get the ChatML template without a default system prompt:

    <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from refengine.entrypoints.protocol import BadRequest, ChatMessage

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
ChatRender = Callable[[list[dict[str, Any]], bool], str]  # (messages, add_generation_prompt) -> the prompt text


def chatml(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    text = "".join(f"{CHATML_START}{m['role']}\n{m['content']}{CHATML_END}\n" for m in messages)
    return text + (f"{CHATML_START}assistant\n" if add_generation_prompt else "")


def _folder_template(model: str) -> tuple[str, dict[str, str]] | None:
    folder = Path(model)
    if not folder.is_dir():
        return None
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    jinja_path = folder / "chat_template.jinja"
    template = jinja_path.read_text() if jinja_path.is_file() else cfg.get("chat_template")
    if isinstance(template, list):  # several named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        return None

    def token(name: str) -> str:
        tok = cfg.get(name)
        return tok.get("content", "") if isinstance(tok, dict) else (tok or "")

    return template, {"bos_token": token("bos_token"), "eos_token": token("eos_token")}


def chat_renderer(model: str) -> tuple[ChatRender, str]:
    """(render(messages, add_generation_prompt) -> prompt text, a name for the template in use)."""
    found = _folder_template(model)
    if found is None:
        return chatml, "chatml"
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise BadRequest(f"messages: the chat template refused them: {message}", "messages")

    source, special = found
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)

    def render(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **special)

    return render, "folder"


def render_messages(render: ChatRender, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    plain = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        return render(plain, add_generation_prompt)
    except BadRequest:
        raise
    except Exception as e:  # a template error is about the messages it was given
        raise BadRequest(f"messages: the chat template failed: {e}", "messages") from None
