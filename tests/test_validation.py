import pytest

from millm.errors import InvalidParameter
from millm.requests.validation import check_messages, sampling_params


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", 2.01), ("temperature", "hot"), ("temperature", float("nan")),
    ("top_p", 1.5), ("top_p", -0.01), ("frequency_penalty", 2.5), ("presence_penalty", -3),
    ("seed", -1), ("seed", 2**32), ("seed", True), ("seed", 1.5),
    ("max_tokens", 0), ("max_tokens", True), ("max_completion_tokens", -4), ("n", 0),
    ("stop", ""), ("stop", ["a", 3]),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(InvalidParameter) as exc:
        sampling_params({field: value})
    assert exc.value.param == field
    assert field in exc.value.message
    assert exc.value.status == 400


def test_good_values_and_nulls():
    p = sampling_params({"temperature": 0, "top_p": 1, "seed": 2**32 - 1, "stop": "x", "max_tokens": None,
                         "frequency_penalty": -2, "presence_penalty": 2})
    assert (p.temperature, p.seed, p.stop, p.max_tokens) == (0.0, 2**32 - 1, ("x",), None)


def test_max_completion_tokens_is_max_tokens():
    assert sampling_params({"max_completion_tokens": 7}).max_tokens == 7
    assert sampling_params({"max_tokens": 7, "max_completion_tokens": 7}).max_tokens == 7
    with pytest.raises(InvalidParameter, match="max_tokens.*max_completion_tokens"):
        sampling_params({"max_tokens": 7, "max_completion_tokens": 8})


def test_messages_normalised_and_refused():
    msgs = check_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"
    with pytest.raises(InvalidParameter, match=r"messages\[0\].role"):
        check_messages([{"role": "wizard", "content": "x"}])
    with pytest.raises(InvalidParameter, match="empty"):
        check_messages([{"role": "user", "content": ""}])
    with pytest.raises(InvalidParameter, match=r"messages\[0\].content\[0\]"):
        check_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(InvalidParameter):
        check_messages([])
