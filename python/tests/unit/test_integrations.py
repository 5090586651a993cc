"""The pure parts of the framework backends: references, specs, state round trips, the scope
mapping of agentscope's isolation policies, workspace ids, and what counts as a command that
never reached a pod."""

from __future__ import annotations

import io
import tarfile

import pytest
from agents.sandbox.manifest import Manifest
from agentscope.app.workspace_manager import IsolationPolicy

import agentbox
from agentbox.integrations._pods import pod_was_missing
from agentbox.integrations.agentscope import (
    not_found,
    parse_workspace_id,
    scope_for,
    scope_workspace_id,
)
from agentbox.integrations.openai_agents import (
    AgentboxSandboxClient,
    AgentboxSandboxClientOptions,
    AgentboxSandboxSessionState,
    build_spec,
    can_skip_restore,
    choose_port_access,
    decode_reference,
    encode_reference,
    scope_of,
    skipped,
)


def test_a_reference_round_trips_and_a_tar_stream_is_not_one() -> None:
    raw = encode_reference("snap-1", "agents", "session-abc", "uid-1")
    assert len(raw) < 200
    assert decode_reference(raw) == {
        "snapshot": "snap-1",
        "namespace": "agents",
        "sandbox": "session-abc",
        "sandboxUid": "uid-1",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("notes.txt")
        tf.addfile(info, io.BytesIO(b""))
    assert decode_reference(buf.getvalue()) is None
    assert decode_reference(raw[:-2]) is None  # cut JSON


def test_the_spec_takes_the_manifest_root_and_names_each_exposed_port() -> None:
    opts = AgentboxSandboxClientOptions(
        image="img", exposed_ports=(8080, 9000), snapshot_restore="None", env={"A": "1"}
    )
    spec = build_spec(opts, Manifest(root="/work"))
    body = spec.to_dict()
    assert body["workspace"]["root"] == "/work"
    assert body["ports"] == [
        {"name": "p8080", "port": 8080, "protocol": "TCP"},
        {"name": "p9000", "port": 9000, "protocol": "TCP"},
    ]
    assert body["snapshot"]["restore"] == "None"
    assert body["env"] == [{"name": "A", "value": "1"}]
    assert (
        "ports" not in build_spec(AgentboxSandboxClientOptions(image="img"), Manifest()).to_dict()
    )


def test_auto_port_access_is_the_service_inside_a_cluster_and_a_port_forward_outside() -> None:
    assert choose_port_access("auto", in_cluster=True) == "service"
    assert choose_port_access("auto", in_cluster=False) == "port-forward"
    assert choose_port_access("pod-ip", in_cluster=False) == "pod-ip"


def test_a_restore_is_skipped_only_for_the_same_sandbox_or_one_restored_from_that_snapshot() -> (
    None
):
    ref = decode_reference(encode_reference("snap-1", "ns", "sbx", "uid-1"))
    assert can_skip_restore(ref, "uid-1", None)
    assert can_skip_restore(ref, "uid-2", "snap-1")
    assert not can_skip_restore(ref, "uid-2", None)
    assert not can_skip_restore(ref, "uid-2", "snap-0")
    assert not can_skip_restore(None, "uid-1", "snap-1")


def test_session_state_round_trips_through_the_framework_serialisation() -> None:
    from agents.sandbox.snapshot import NoopSnapshot

    state = AgentboxSandboxSessionState(
        manifest=Manifest(),
        snapshot=NoopSnapshot(id="x"),
        namespace="agents",
        sandbox_name="session-abc",
        sandbox_uid="uid-1",
        scope={"kind": "Session", "agent": "a", "session": "s"},
        spec={"image": "img"},
        last_snapshot="snap-1",
        exposed_ports=(8080,),
    )
    client = AgentboxSandboxClient()
    back = client.deserialize_session_state(client.serialize_session_state(state))
    assert isinstance(back, AgentboxSandboxSessionState)
    assert (back.sandbox_name, back.sandbox_uid, back.last_snapshot) == (
        "session-abc",
        "uid-1",
        "snap-1",
    )
    assert back.exposed_ports == (8080,)


def test_options_refuse_unknown_policies_before_any_request() -> None:
    with pytest.raises(ValueError):
        AgentboxSandboxClientOptions(image="img", on_delete="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        AgentboxSandboxClientOptions(image="img", workspace_persistence="zip")  # type: ignore[arg-type]


def test_options_take_a_scope_or_its_dict_form_and_keep_a_scope() -> None:
    from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions

    scope = agentbox.Scope.for_user("coder", "alice@example.com")
    given = AgentboxSandboxClientOptions(image="img", scope=scope)
    assert given.scope == scope
    as_dict = AgentboxSandboxClientOptions(image="img", scope=scope.to_dict())
    assert as_dict.scope == scope
    assert AgentboxSandboxClientOptions(image="img").scope is None
    # Options make JSON round trips in the framework's run state.
    payload = given.model_dump(mode="json")
    back = BaseSandboxClientOptions.parse(payload)
    assert isinstance(back, AgentboxSandboxClientOptions) and back.scope == scope
    # A dict the CRD would refuse is refused here, before any request.
    with pytest.raises(ValueError, match=r"scope\.user is required"):
        AgentboxSandboxClientOptions(image="img", scope={"kind": "User", "agent": "coder"})
    assert scope_of(None) is None
    assert scope_of({"kind": "Global"}) == agentbox.Scope.for_global()


def test_a_missing_file_is_not_found_in_agentscopes_words() -> None:
    e = not_found("/workspace/nope.txt")
    assert isinstance(e, FileNotFoundError) and isinstance(e, agentbox.RemoteFileNotFoundError)
    assert str(e) == "not found in the sandbox: /workspace/nope.txt"


def test_isolation_policies_map_onto_scopes() -> None:
    ids = {"user_id": "alice@example.com", "agent_id": "coder", "session_id": "s1"}
    assert scope_for(IsolationPolicy.PER_SESSION, **ids) == agentbox.Scope.for_session(
        "coder", "s1"
    )
    assert scope_for(IsolationPolicy.PER_AGENT, **ids) == agentbox.Scope.for_user(
        "coder", "alice@example.com"
    )
    assert scope_for(IsolationPolicy.PER_USER, **ids, app_agent="app") == agentbox.Scope.for_user(
        "app", "alice@example.com"
    )
    assert scope_for("per_agent", user_id="u", agent_id="", session_id="s") == (
        agentbox.Scope.for_user("agentscope", "u")
    )


@pytest.mark.parametrize(
    "scope",
    [
        agentbox.Scope.for_user("co:der", "alice@example.com/x"),
        agentbox.Scope.for_session("a", "s 1"),
        agentbox.Scope.for_agent("a%b"),
        agentbox.Scope.for_global(),
    ],
)
def test_workspace_ids_name_their_scope_reversibly(scope: agentbox.Scope) -> None:
    wid = scope_workspace_id(scope)
    assert wid.startswith("agentbox:")
    assert parse_workspace_id(wid) == scope


def test_a_foreign_workspace_id_is_refused_with_its_cause() -> None:
    with pytest.raises(ValueError, match="does not name an agentbox scope"):
        parse_workspace_id("3f2a9c")
    with pytest.raises(ValueError, match="wrong ids"):
        parse_workspace_id("agentbox:user:only-agent")


def test_only_errors_of_a_missing_pod_count_as_a_command_that_never_started() -> None:
    assert pod_was_missing(agentbox.CommandNotStartedError("container not found"))
    assert pod_was_missing(agentbox.NotFoundError("pod gone"))
    assert not pod_was_missing(agentbox.RemoteFileNotFoundError("no such file"))
    assert not pod_was_missing(agentbox.TransportError("broke"))


def test_tar_members_at_or_under_a_skipped_path_are_dropped() -> None:
    skip = {".agentbox", "cache/tmp"}
    assert skipped("./.agentbox", skip)
    assert skipped("./.agentbox/marker", skip)
    assert skipped("cache/tmp/x", skip)
    assert not skipped("./cache", skip)
    assert not skipped("./.agentboxes", skip)
    assert not skipped(".", skip)
