"""How a question becomes a prompt, in one place for every stage and baseline.

Two styles:

* ``plain`` (the built-in world's tiny models, trained from scratch): ``"Question: q\\n"``.
  A tiny model learns the format from its training data, so an instruction would only cost
  tokens.
* ``chat`` (any instruct model): the tokenizer's chat template with :data:`SYSTEM_PROMPT`,
  which explains the ProRAG format, and the question as the user turn.

The completion (what the policy writes, and what rollouts, losses and rewards see) always
starts right after the prompt with the first ``<step>``.
"""

from __future__ import annotations

from typing import Any, Literal

PromptStyle = Literal["plain", "chat"]

SYSTEM_PROMPT = (
    "Answer the question by reasoning in steps, searching a document collection when you need facts.\n"
    "Every step starts with <step> your thought </step> and then does exactly one thing:\n"
    "- search: <subquery> a few search keywords </subquery>; the documents found are then shown between "
    "<retrieval> and </retrieval>;\n"
    "- conclude: <subanswer> an intermediate conclusion </subanswer>;\n"
    "- finish: <answer> the final answer, a few words only </answer>.\n"
    "Example: <step> I need the director of the film. </step><subquery> film X director </subquery>"
)

#: Instructions for the simple baselines (no step format).
DIRECT_ANSWER_PROMPT = "Answer the question with a few words only, no explanation."
RAG_ANSWER_PROMPT = "Answer the question using the documents. Answer with a few words only, no explanation."


def plain_prompt(question: str) -> str:
    """The prompt of a tiny model trained from scratch."""
    return f"Question: {question.strip()}\n"


def chat_prompt(tokenizer: Any, question: str, system: str = SYSTEM_PROMPT, documents: str | None = None) -> str:
    """A chat-template prompt ending with the assistant's turn opener."""
    user = question.strip() if documents is None else f"Documents:\n{documents}\n\nQuestion: {question.strip()}"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def build_prompt(tokenizer: Any, question: str, style: PromptStyle | None = None) -> str:
    """The ProRAG-format prompt for ``question``; ``style`` defaults to chat when the tokenizer has a template."""
    style = style or ("chat" if has_chat_template(tokenizer) else "plain")
    if style == "plain":
        return plain_prompt(question)
    if style == "chat":
        return chat_prompt(tokenizer, question)
    raise ValueError(f"unknown prompt style {style!r}; expected 'plain' or 'chat'")


def prompt_token_ids(tokenizer: Any, question: str, style: PromptStyle | None = None) -> list[int]:
    """The prompt ids of ``question``: :func:`build_prompt` tokenised without added special tokens.

    The one definition shared by the rollout engine (what a policy is fed), SFT (what it is
    trained on) and the context budget (:mod:`prorag.agent.context_budget`, what it measures), so
    that training and inference prompts are the same ids. Tokenised without transformers' warning
    on a prompt longer than the model: the budget decides what to do with one, and says so.
    """
    return tokenizer(build_prompt(tokenizer, question, style), add_special_tokens=False, verbose=False)["input_ids"]
