"""How many tokens a request generates: its fields, the endpoint's default, the server's limit.

Chat takes ``max_completion_tokens`` before ``max_tokens`` (OpenAI deprecates ``max_tokens``
for chat in its favour); completions know only ``max_tokens``. Every field a request gives is
checked against the server's limit, the one that counts and the one it supersedes alike, so no
combination of fields generates past the limit. A request without either gets the endpoint's
default, lowered to the limit.
"""

from __future__ import annotations

from eagletree.app.server.protocol import BadRequest, ChatBody, CompletionBody

COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default for completions
CHAT_DEFAULT_TOKENS = 256


def max_new_tokens(body: CompletionBody | ChatBody, limit: int) -> int:
    """The most tokens ``body`` generates (1 to ``limit``); a ``BadRequest`` naming the field
    that asks for more than ``limit``."""
    asked = _asked(body)
    for field, value in asked:
        if value > limit:
            raise BadRequest(f"{field} = {value} exceeds this server's limit of {limit}", field)
    if asked:
        return asked[0][1]
    default = CHAT_DEFAULT_TOKENS if isinstance(body, ChatBody) else COMPLETION_DEFAULT_TOKENS
    return min(default, limit)


def _asked(body: CompletionBody | ChatBody) -> list[tuple[str, int]]:
    """The token fields ``body`` gives, the one that counts first."""
    fields = [("max_tokens", body.max_tokens)]
    if isinstance(body, ChatBody):
        fields.insert(0, ("max_completion_tokens", body.max_completion_tokens))
    return [(field, value) for field, value in fields if value is not None]
