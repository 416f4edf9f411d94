"""The Batch API's lines (pure): validation names the bad lines, the output and error files keep
each custom_id once, a multipart upload is read."""

from __future__ import annotations

import json

from router.frontend.batch_lines import (
    EXPIRED_MESSAGE,
    expired_line,
    multipart_form,
    result_line,
    split_results,
    validate,
)

URL = "/v1/chat/completions"


def _line(cid: str, url: str = URL, **extra: object) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": {}} | extra)


def test_validation_names_each_bad_line() -> None:
    content = "\n".join(
        [
            _line("a"),
            "{not json",
            _line("a"),  # a repeat
            _line("b", url="/v1/embeddings"),
            json.dumps({"method": "POST", "url": URL, "body": {}}),
            "",
            _line("c"),
        ]
    ).encode()
    lines, errors = validate(content, URL)
    assert [(e["code"], e["line"]) for e in errors] == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
        ("mismatched_url", 4),
        ("missing_custom_id", 5),
    ]
    assert [(line.number, line.custom_id) for line in lines] == [(1, "a"), (7, "c")]
    assert validate(b"\n\n", URL)[1][0]["code"] == "empty_file"


def test_each_custom_id_is_answered_once_and_errors_go_apart() -> None:
    results = [
        result_line("a", 200, {"ok": 1}, "r1"),
        result_line("b", 400, {"error": {"message": "no"}}, "r2"),
        result_line("a", 200, {"ok": 2}, "r3"),  # answered again (a takeover): dropped
    ]
    out, err, n_out, n_err = split_results(results)
    assert (n_out, n_err) == (1, 1)
    [kept] = [json.loads(x) for x in out.splitlines()]
    assert kept["response"]["body"] == {"ok": 1} and kept["response"]["request_id"] == "r1"
    assert json.loads(err)["custom_id"] == "b"


def test_a_multipart_upload_is_read() -> None:
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b'Content-Type: application/octet-stream\r\n\r\n{"a": 1}\n\r\n--XyZ--\r\n'
    )
    form = multipart_form("multipart/form-data; boundary=XyZ", body)
    assert form["purpose"] == (None, b"batch")
    assert form["file"] == ("in.jsonl", b'{"a": 1}\n')


def test_an_expired_line_goes_to_the_error_file_in_openais_shape() -> None:
    ok = result_line("a", 200, {"x": 1}, "req_a")
    out, err, n_ok, n_err = split_results([ok, expired_line("b"), expired_line("a")])
    assert (n_ok, n_err) == (1, 1)  # "a" was answered first: its expired line is dropped
    (line,) = [json.loads(x) for x in err.decode().splitlines()]
    assert line["custom_id"] == "b" and line["response"] is None
    assert line["error"] == {"code": "batch_expired", "message": EXPIRED_MESSAGE}
    assert json.loads(out)["custom_id"] == "a"
