"""Every vector the Rust code generates (tests/vectors/protocol.json) must come out the same
here: scope keys, labels, names, path rules, exec argv and status, session framing, file
scripts and the guard's expiry rule."""

from __future__ import annotations

import datetime as dt
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import agentbox
from agentbox import _wire, files, guard, labels
from agentbox.errors import (
    CommandNotStartedError,
    InvalidRequestError,
    PathError,
    ProtocolError,
    SessionError,
)
from agentbox.exec import ExecResult
from agentbox.scope import Scope
from agentbox.session import Framer, command_line

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "tests" / "vectors" / "protocol.json").read_text()
)


def test_the_vector_file_is_the_format_this_suite_reads() -> None:
    assert VECTORS["format"] == 2


def test_label_and_annotation_keys() -> None:
    v = VECTORS["labels"]
    assert (
        v["scope"],
        v["scope_key"],
        v["agent"],
        v["user"],
        v["session"],
    ) == (labels.SCOPE, labels.SCOPE_KEY, labels.AGENT, labels.USER, labels.SESSION)
    assert (
        v["sandbox"],
        v["managed_by"],
        v["manager"],
    ) == (labels.SANDBOX, labels.MANAGED_BY, labels.MANAGER)
    assert (
        v["agent_id"],
        v["user_id"],
        v["session_id"],
    ) == (labels.AGENT_ID, labels.USER_ID, labels.SESSION_ID)
    assert (v["scope_key_len"], v["max_label"]) == (labels.SCOPE_KEY_LEN, labels.MAX_LABEL)


@pytest.mark.parametrize("case", VECTORS["scopes"], ids=lambda c: c["sandbox_name"])
def test_scope_keys_labels_and_names(case: dict[str, Any]) -> None:
    scope = Scope.from_dict(case["scope"])
    assert scope.to_dict() == case["scope"]
    key = labels.scope_key(scope)
    assert key == case["scope_key"]
    assert labels.scope_labels(scope) == case["labels"]
    assert labels.scope_annotations(scope) == case["annotations"]
    assert labels.scope_selector(scope) == case["selector"]
    name = labels.sandbox_name_for_scope(scope)
    assert name == case["sandbox_name"]
    assert labels.pod_name(name) == case["pod_name"]
    assert labels.sandbox_label_value(name) == case["sandbox_label_value"]
    assert labels.lease_name(key) == case["lease_name"]


@pytest.mark.parametrize("case", VECTORS["label_values"], ids=lambda c: repr(c["value"])[:20])
def test_label_value_validity(case: dict[str, Any]) -> None:
    assert labels.is_valid_label_value(case["value"]) is case["valid"]


@pytest.mark.parametrize(
    "case", VECTORS["bounded_names"], ids=lambda c: f"{c['base'][:10]}-{c['max']}"
)
def test_bounded_names(case: dict[str, Any]) -> None:
    assert labels.bounded_name(case["base"], case["max"]) == case["name"]


@pytest.mark.parametrize("case", VECTORS["confine"], ids=lambda c: f"{c['root']}|{c['path']}")
def test_path_confinement(case: dict[str, Any]) -> None:
    if "ok" in case:
        assert files.confine(case["root"], case["path"]) == case["ok"]
    else:
        with pytest.raises(PathError) as e:
            files.confine(case["root"], case["path"])
        assert e.value.reason == case["error"]


def test_exec_constants_and_wrapper() -> None:
    v = VECTORS["exec"]
    assert v["container"] == _wire.SANDBOX_CONTAINER
    assert list(_wire.PROTOCOLS) == v["protocols"]
    assert tuple(v["channels"][k] for k in ("stdin", "stdout", "stderr", "status", "close")) == (
        _wire.STDIN_CHANNEL,
        _wire.STDOUT_CHANNEL,
        _wire.STDERR_CHANNEL,
        _wire.STATUS_CHANNEL,
        _wire.CLOSE_CHANNEL,
    )
    assert v["stdin_frame"] == _wire.STDIN_FRAME
    assert v["default_max_output"] == _wire.DEFAULT_MAX_OUTPUT
    assert v["timeout_grace_ms"] == _wire.TIMEOUT_GRACE * 1000
    assert v["wrapper"] == _wire.WRAPPER
    assert v["process_env"] == _wire.PROCESS_ENV
    assert v["processes_script"] == _wire.PROCESSES


def _request(r: dict[str, Any]) -> tuple[list[str], float | None, str | None, dict[str, str]]:
    timeout = None if r["timeout_ms"] is None else r["timeout_ms"] / 1000
    return r["argv"], timeout, r["workdir"], dict(r["env"])


def _stdin_len(r: dict[str, Any]) -> int | None:
    """The vectors' stdin (``null``, a byte count or ``"stream"``) as :func:`_wire.stdin_mode`
    takes it."""
    s = r["stdin"]
    return None if s is None else -1 if s == "stream" else int(s)


@pytest.mark.parametrize(
    "case", VECTORS["exec"]["remote_argv"], ids=lambda c: " ".join(c["request"]["argv"])[:30]
)
def test_remote_argv(case: dict[str, Any]) -> None:
    argv, timeout, workdir, env = _request(case["request"])
    mode = _wire.stdin_mode(_stdin_len(case["request"]))
    if "error" in case:
        assert case["error"] == "Invalid"
        with pytest.raises(InvalidRequestError):
            _wire.remote_argv(argv, timeout, workdir, env, mark=case["mark"], stdin=mode)
    else:
        got = _wire.remote_argv(argv, timeout, workdir, env, mark=case["mark"], stdin=mode)
        assert got == case["remote_argv"]


@pytest.mark.parametrize(
    "case", VECTORS["exec"]["trailer"], ids=lambda c: "|".join(c["chunks"])[:40] or "empty"
)
def test_trailer_hold_back(case: dict[str, Any]) -> None:
    t = _wire.Trailer(case["mark"])
    passed = [t.push(c.encode()).decode() for c in case["chunks"]]
    assert passed == case["passed"]
    assert "".join(passed) == case["out"]
    assert (t.whole, t.received) == (case["whole"], case["received"])
    assert t.memory == case["memory"]


@pytest.mark.parametrize("case", VECTORS["session"]["end_trailers"], ids=lambda c: c["trailer"])
def test_session_end_trailer(case: dict[str, Any]) -> None:
    got = _wire.parse_session_end(case["trailer"])
    if case.get("unparsable"):
        assert got is None
    else:
        assert got == (case["code"], case["memory"])


def test_out_of_memory_constants() -> None:
    oom = VECTORS["oom"]
    assert oom["reason"] == _wire.OOM_KILLED
    assert oom["memory_flag"] == _wire.MEMORY_FLAG
    assert oom["clock_skew_ms"] == _wire.OOM_CLOCK_SKEW * 1000
    assert oom["settle_ms"] == _wire.OOM_SETTLE * 1000
    assert oom["poll_ms"] == round(_wire.OOM_POLL * 1000)
    assert _wire.memory_trailer(oom["memory_trailer"]["mark"]) == oom["memory_trailer"]["trailer"]
    for f in oom["counter_files"]:
        assert f in _wire.WRAPPER and f in _wire.SESSION_OOM


@pytest.mark.parametrize("case", VECTORS["oom"]["container"], ids=lambda c: json.dumps(c)[:60])
def test_container_killed_for_memory(case: dict[str, Any]) -> None:
    since = datetime.fromisoformat(case["since"].replace("Z", "+00:00"))
    pod = {"metadata": {"name": "p"}, "status": case["status"]}
    assert _wire.oom_killed_since(pod, VECTORS["exec"]["container"], since) == case["killed"]


@pytest.mark.parametrize("case", VECTORS["exec"]["sleep_arg"], ids=lambda c: str(c["ms"]))
def test_sleep_arg(case: dict[str, Any]) -> None:
    assert _wire.sleep_arg(case["ms"] / 1000) == case["arg"]


@pytest.mark.parametrize(
    "case", VECTORS["exec"]["status"], ids=lambda c: json.dumps(c["outcome"])[:40]
)
def test_exit_status_from_the_status_channel(case: dict[str, Any]) -> None:
    raw = json.dumps(case["status"]).encode()
    outcome = case["outcome"]
    if "code" in outcome:
        assert _wire.parse_status(raw) == _wire.ExitStatus(outcome["code"])
    elif "unknown" in outcome:
        assert _wire.parse_status(raw) == _wire.ExitStatus(None, outcome["unknown"])
    else:
        with pytest.raises(CommandNotStartedError) as e:
            _wire.parse_status(raw)
        assert str(e.value) == outcome["not_started"]


def test_a_status_that_is_not_json_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        _wire.parse_status(b"{nope")


@pytest.mark.parametrize(
    "case", VECTORS["session"]["command_lines"], ids=lambda c: " ".join(c["request"]["argv"])[:30]
)
def test_session_command_line(case: dict[str, Any]) -> None:
    argv, timeout, workdir, env = _request(case["request"])
    if "error" in case:
        with pytest.raises(InvalidRequestError):
            command_line(_wire.session_argv(argv, timeout, workdir, env), case["mark"])
    else:
        assert (
            command_line(_wire.session_argv(argv, timeout, workdir, env), case["mark"])
            == case["line"]
        )


@pytest.mark.parametrize(
    "case", VECTORS["session"]["framing"], ids=lambda c: "|".join(c["chunks"])[:30]
)
def test_session_framing(case: dict[str, Any]) -> None:
    start = case["start"].encode() if case["start"] is not None else None
    f = Framer(start, case["end"], case["cap"])
    expected = case["outcome"]
    got: dict[str, Any] = {"incomplete": True}
    for i, chunk in enumerate(case["chunks"]):
        try:
            done = f.feed(chunk.encode())
        except SessionError:
            got = {"error": "Session", "after_chunk": i}
            break
        if done is not None:
            got = {"trailer": done[0], "rest": done[1].decode(), "after_chunk": i}
            break
    assert got == expected
    assert f.out.buf.decode() == case["out"]
    assert f.out.truncated is case["truncated"]


def test_file_scripts_are_the_rust_ones() -> None:
    v = VECTORS["files"]
    assert v["argv0"] == files.ARGV0
    assert v["prologue"] == files.PROLOGUE
    assert v["scripts"] == {
        "read": files.READ,
        "write": files.WRITE,
        "list": files.LIST,
        "upload": files.UPLOAD,
        "download": files.DOWNLOAD,
    }
    assert (
        v["exit_escapes"],
        v["exit_missing"],
        v["exit_spool_failed"],
        v["exit_too_large"],
        v["read_cap"],
    ) == (files.ESCAPES, files.MISSING, files.SPOOL_FAILED, files.TOO_LARGE, files.READ_CAP)
    assert "${" + v["limit_env"] + ":-}" in files.UPLOAD


def test_a_failed_upload_spool_is_its_own_error() -> None:
    def result(code: int) -> ExecResult:
        return ExecResult(code, b"", b"cat: write error: No space left on device\n")

    with pytest.raises(agentbox.UploadSpoolError) as e:
        files.check("/workspace/src", result(files.SPOOL_FAILED))
    assert isinstance(e.value, agentbox.RemoteError)
    assert e.value.exit_code == files.SPOOL_FAILED
    assert "disk full" in str(e.value) and "No space left on device" in str(e.value)
    with pytest.raises(agentbox.RemoteError) as other:
        files.check("/workspace/src", result(1))
    assert not isinstance(other.value, agentbox.UploadSpoolError)


def test_an_upload_past_the_size_limit_is_its_own_error() -> None:
    said = b"agentbox: the upload would pass the workspace's size limit of 67108864 bytes\n"
    with pytest.raises(agentbox.UploadTooLargeError) as e:
        files.check("/workspace/src", ExecResult(files.TOO_LARGE, b"", said))
    assert isinstance(e.value, agentbox.RemoteError)
    assert not isinstance(e.value, agentbox.UploadSpoolError)
    assert e.value.exit_code == files.TOO_LARGE
    assert "size limit of 67108864 bytes" in str(e.value)
    assert agentbox.kind_of(e.value) == "UploadTooLarge"


@pytest.mark.parametrize(
    "case", VECTORS["files"]["requests"], ids=lambda c: f"{c['script']}:{c['path']}"
)
def test_file_request_argv(case: dict[str, Any]) -> None:
    script = {
        "read": files.READ,
        "write": files.WRITE,
        "list": files.LIST,
        "upload": files.UPLOAD,
        "download": files.DOWNLOAD,
    }[case["script"]]
    if "error" in case:
        with pytest.raises(PathError) as e:
            files.file_argv(script, case["root"], case["path"])
        assert e.value.reason == case["error"]
    else:
        assert files.file_argv(script, case["root"], case["path"]) == (
            case["argv"],
            case["confined"],
        )


@pytest.mark.parametrize("case", VECTORS["files"]["listings"], ids=lambda c: c["raw"][:20])
def test_listing_records(case: dict[str, Any]) -> None:
    raw = case["raw"].encode()
    if case.get("error"):
        with pytest.raises(ProtocolError):
            files.parse_listing(raw)
        return
    got = [
        {
            "name": e.name,
            "kind": e.kind.capitalize(),
            "size": e.size,
            "mode": e.mode,
            "mtime": e.mtime,
        }
        for e in files.parse_listing(raw)
    ]
    assert got == case["entries"]


def test_guard_defaults() -> None:
    d = VECTORS["guard"]["defaults"]
    cfg = guard.GuardConfig()
    assert (cfg.lease_duration * 1000, cfg.retry_interval * 1000, cfg.clock_skew * 1000) == (
        d["lease_duration_ms"],
        d["retry_interval_ms"],
        d["clock_skew_ms"],
    )


@pytest.mark.parametrize(
    "case",
    VECTORS["guard"]["judge"],
    ids=lambda c: f"{c.get('me')}-{c['now'][11:23]}-{c['unchanged_for_ms']}",
)
def test_guard_verdicts(case: dict[str, Any]) -> None:
    verdict = guard.judge(
        case["spec"],
        guard.parse_time(case["now"]),
        case["unchanged_for_ms"] / 1000,
        case["clock_skew_ms"] / 1000,
        case["default_duration_ms"] / 1000,
        annotations=case.get("annotations"),
        me=case.get("me"),
        slot_unchanged_for=case.get("slot_unchanged_for_ms", 0) / 1000,
    )
    assert verdict == case["verdict"]


def test_guard_annotation_names() -> None:
    names = VECTORS["guard"]["annotation_names"]
    assert (
        names["next"],
        names["next_renew"],
        names["fair_holder"],
    ) == (guard.NEXT_ANNOTATION, guard.NEXT_RENEW_ANNOTATION, guard.FAIR_HOLDER_ANNOTATION)
    assert VECTORS["guard"]["defaults"]["watch_fallback_ms"] == guard.WATCH_FALLBACK * 1000
    assert VECTORS["guard"]["defaults"]["yield_ms"] == round(guard.YIELD * 1000)


@pytest.mark.parametrize("case", VECTORS["guard"]["annotations"], ids=lambda c: c["op"])
def test_guard_annotation_writes(case: dict[str, Any]) -> None:
    before, me = case["before"], case["me"]
    if case["op"] == "take":
        got: dict[str, str] | None = guard.taken_annotations(before, me)
    elif case["op"] == "claim":
        got = guard.claimed_annotations(before, me, guard.parse_time(case["now"]))
    else:
        got = guard.withdrawn_annotations(before, me)
    assert got == case["after"]


@pytest.mark.parametrize("case", VECTORS["guard"]["shared_hold"])
def test_guard_shared_hold(case: dict[str, Any]) -> None:
    got = guard.shared_hold(case["queue"], case["waited"], case["before"], case["me"])
    assert got == case["shared"]


@pytest.mark.parametrize("case", VECTORS["guard"]["yield"])
def test_guard_yield(case: dict[str, Any]) -> None:
    got = guard.yield_for(case["annotations"], case["me"], case["yield_left_ms"] / 1000)
    assert round(got * 1000) == case["yield_ms"]


@pytest.mark.parametrize("case", VECTORS["guard"]["released_spec"])
def test_guard_released_spec(case: dict[str, Any]) -> None:
    assert guard.released_spec(case["before"]) == case["after"]


@pytest.mark.parametrize(
    "case", VECTORS["guard"]["taken_spec"], ids=lambda c: str(c["lease_duration_ms"])
)
def test_guard_taken_spec(case: dict[str, Any]) -> None:
    cfg = guard.GuardConfig(lease_duration=case["lease_duration_ms"] / 1000, holder=case["holder"])
    assert guard.taken_spec(case["old"], cfg, guard.parse_time(case["now"])) == case["spec"]


@pytest.mark.parametrize(
    "case", VECTORS["guard"]["timings"], ids=lambda c: str(c["lease_duration_ms"])
)
def test_guard_timings(case: dict[str, Any]) -> None:
    cfg = guard.GuardConfig(lease_duration=case["lease_duration_ms"] / 1000)
    assert cfg.duration_secs == case["duration_secs"]
    assert int(cfg.renew_every * 1000) == case["renew_every_ms"]
    assert round(cfg.trust_window * 1000) == case["trust_window_ms"]


def test_micro_time_round_trips() -> None:
    t = dt.datetime(2027, 1, 15, 8, 0, 30, 123456, tzinfo=dt.timezone.utc)
    assert guard.micro_time(t) == "2027-01-15T08:00:30.123456Z"
    assert guard.parse_time("2027-01-15T08:00:30.123456Z") == t
    assert guard.parse_time("2027-01-15T09:00:30.1234567+01:00") == t


@pytest.mark.parametrize("case", VECTORS["session"]["shell_argv"], ids=lambda c: str(c["workdir"]))
def test_session_shell_argv(case: dict[str, Any]) -> None:
    assert _wire.session_shell_argv(case["workdir"]) == case["argv"]


def test_every_error_kind_has_its_own_class() -> None:
    # ERROR_KINDS is generated from the same Rust table as the vectors: a kind the vectors name
    # for Python must map to that class, exported by the package, refining its parent's class;
    # no kind falls back to a vaguer class.
    kinds = VECTORS["error_kinds"]
    named = [k for k in kinds if k["python"] is not None]
    assert sorted(agentbox.ERROR_KINDS) == sorted(k["kind"] for k in named)
    for k in kinds:
        if k["python"] is None:
            assert k["kind"] not in agentbox.ERROR_KINDS
            continue
        cls = agentbox.ERROR_KINDS[k["kind"]]
        assert cls.__name__ == k["python"]
        assert getattr(agentbox, k["python"]) is cls
        assert k["python"] in agentbox.__all__
        parent = agentbox.ERROR_KINDS[k["parent"]] if k["parent"] else agentbox.AgentboxError
        assert issubclass(cls, parent) and cls is not parent, k


def test_kind_of_names_the_most_specific_kind() -> None:
    assert agentbox.kind_of(agentbox.RemoteFileNotFoundError("x")) == "FileNotFound"
    assert agentbox.kind_of(agentbox.NotFoundError("x")) == "NotFound"
    assert agentbox.kind_of(agentbox.UploadSpoolError(96, "disk full")) == "UploadSpool"
    assert agentbox.kind_of(agentbox.GuardLostError("lease")) == "GuardLost"
    assert agentbox.kind_of(agentbox.OutputCutError("stdout", 3)) == "OutputCut"
    assert agentbox.kind_of(agentbox.AgentboxError("root")) is None
    assert agentbox.kind_of(ValueError("not ours")) is None
