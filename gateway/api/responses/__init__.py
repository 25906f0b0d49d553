"""``POST /v1/responses``: OpenAI's Responses API, stateless, served as a chat completion.

A responses request is validated (``protocol.ResponsesRequest``, with the same written
field policy as chat: passed, ignored or refused, and any other top-level field a 400
naming it), then translated into the chat completion request it means (``to_chat``):
``instructions`` and the ``input`` items become messages, function tools and
``tool_choice`` their chat forms, ``reasoning.effort`` and ``text.verbosity`` chat's
``reasoning_effort`` and ``verbosity``, ``text.format`` a ``response_format``,
``max_output_tokens`` ``max_completion_tokens``.
From there it takes the chat path exactly: authentication, tier, admission, relay to vLLM,
metering and billing, so a response costs what the same chat completion costs.

vLLM's chat answer comes back as a Response: reasoning text as a ``reasoning`` item (its
``content``; summaries are never written), the answer as an assistant ``message`` item,
each tool call as a ``function_call`` item, chat usage as the Responses usage (reasoning
tokens included in output tokens). ``output.ResponseAssembler`` builds one for a request
that does not stream; ``events.ResponseEventWriter`` streams the same Response as events.

Nothing is stored: ``store`` must be false or absent (OpenAI's default is true, which
would promise a retrievable response), and ``previous_response_id``, ``conversation``,
``background`` and stored ``prompt``s are refused; a client keeps the conversation and
sends it whole in ``input``, reasoning items included (they are dropped: the model's
template does not show earlier turns' thinking).
"""
