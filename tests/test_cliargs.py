"""Every numeric and address option is checked when the command line is parsed: a bad
value is one line on stderr and exit 2, before a probe is loaded, a port bound or an API
server called. Never a traceback, never a run that ends at once with exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from execwatch import cliargs
from execwatch.cli import build_parser, main

BAD_VALUES = [
    ("trace", "--death-window", ["0", "-1", "nan", "inf", "3601", "two"]),
    ("trace", "--diagnosis-budget", ["0", "601", "nan"]),
    ("trace", "--window", ["-3", "nan", "inf", "3601"]),
    ("trace", "--duration", ["0", "-1", "nan", "inf"]),
    ("trace", "--ringbuf-mb", ["0", "3", "2048", "4.0", "-4"]),
    ("trace", "--metrics-address", ["nope", "127.0.0.1:99999", "host:", ":-1"]),
    ("agent", "--rate", ["0", "-5", "nan"]),
    ("agent", "--burst", ["0", "1.5"]),
    ("agent", "--spool-size", ["0", "-1"]),
    ("agent", "--spool-bytes", ["100", "8589934592"]),
    ("agent", "--aggregation-window", ["-1", "inf"]),
    ("agent", "--metrics-address", ["9090"]),
    ("handler", "--workers", ["0", "257"]),
    ("handler", "--max-series", ["0"]),
    ("handler", "--lease-duration", ["0", "nan"]),
    ("handler", "--retry-period", ["-2"]),
    ("agent", "--node", ["", "Worker_1", "-a", "a..b", "x" * 254]),
    ("agent", "--namespace", ["", "Bad NS", "a.b", "x" * 64]),
    ("handler", "--lease-name", ["", "UPPER"]),
]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [(c, o, v) for c, o, values in BAD_VALUES for v in values],
)
def test_a_bad_value_is_a_one_line_usage_error(
    capsys: pytest.CaptureFixture[str], command: str, option: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, f"{option}={value}"])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2
    assert len(err) == 1
    assert err[0].startswith(f"execwatch {command}: error: argument {option}: wants ")
    assert err[0].endswith(f"got {value!r} (see execwatch {command} --help)")


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (cliargs.Number(0, 3600), "0.25", 0.25),
        (cliargs.Number(0, 3600), "3600", 3600.0),
        (cliargs.Number(0, 3600, zero=True), "0", 0.0),
        (cliargs.Count(1, 1024, power_of_two=True), "1", 1),
        (cliargs.Count(1, 1024, power_of_two=True), "1024", 1024),
        (cliargs.Count(1, 256), "16", 16),
        (cliargs.address, ":9090", ("0.0.0.0", 9090)),
        (cliargs.address, "[::1]:0", ("::1", 0)),
        (cliargs.address, "127.0.0.1:65535", ("127.0.0.1", 65535)),
        (cliargs.dns_label, "x" * 63, "x" * 63),
        (
            cliargs.dns_subdomain,
            "ip-10-0-1-7.eu-west-1.compute.internal",
            "ip-10-0-1-7.eu-west-1.compute.internal",
        ),
        (cliargs.dns_subdomain, "worker-1", "worker-1"),
    ],
)
def test_the_bounds_themselves_are_accepted(parse: object, text: str, value: object) -> None:
    assert callable(parse) and parse(text) == value


def test_the_lease_timings_must_nest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"  # a server nobody answers at: credentials parse
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    argv = ["handler", "--kubeconfig", str(kubeconfig), "--metrics-address", "127.0.0.1:0"]
    assert main([*argv, "--renew-deadline", "20"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "execwatch: need retry_period < renew_deadline < lease_duration"
    ]


@pytest.mark.parametrize("content", [None, "garbage: [\n"])
def test_the_handler_without_credentials_says_so_in_one_line(
    tmp_path: Path, content: str | None
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "handler", "--kubeconfig", str(kubeconfig),
         "--metrics-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("execwatch: no API server credentials: ")


@pytest.mark.parametrize("argv", [["--window", "1"], ["--window=0.5"], ["--window"]])
def test_the_agent_has_one_window_and_the_old_flag_names_it(argv: list[str]) -> None:
    """--aggregation-window is the agent's one repeat window (it grows to the kubelet's
    300 s back-off; the node's own fold is a fixed second, agent.daemon.NODE_WINDOW_S):
    a second window flag would be read with a meaning the operator did not mean."""
    out = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "agent", "--node", "worker-1", *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "execwatch agent: error: --window is gone: use --aggregation-window"
        " (see execwatch agent --help)"
    ]


@pytest.mark.parametrize(("command", "option"), [("scan", "--platform"), ("audit", "--arch")])
def test_an_architecture_no_image_uses_is_refused(
    capsys: pytest.CaptureFixture[str], command: str, option: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, f"{option}=amd46", *(["/bin/true"] if command == "scan" else [])])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert f"argument {option}: invalid platform 'amd46': unknown architecture 'amd46'" in err[0]


def test_an_audit_architecture_is_spelled_as_the_node_label_is() -> None:
    assert [cliargs.architecture(a) for a in ("aarch64", "x86_64", "armhf")] == [
        "arm64",
        "amd64",
        "arm",
    ]


@pytest.mark.parametrize("option", ["--registry-config", "--registry-ca"])
@pytest.mark.parametrize("command", ["scan", "audit"])
def test_a_named_credentials_or_ca_file_must_exist(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, option: str
) -> None:
    """Not a quiet anonymous pull, or the system CAs, because of a typo in a path."""
    missing = tmp_path / "auth.jsn"
    with pytest.raises(SystemExit) as exit_:
        main([command, option, str(missing), *(["registry.example/app"] * (command == "scan"))])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert f"argument {option}: no readable file '{missing}'" in err[0]


@pytest.mark.parametrize(
    ("text", "value"), [("0", 0), ("2G", 2 << 30), ("512MiB", 512 << 20), (" 10k ", 10 << 10)]
)
def test_sizes(text: str, value: int) -> None:
    assert cliargs.size(text) == value


def test_the_windows_cap_is_no_option_of_its_own() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "execwatch.cli", "agent", "--aggregation-window-max", "300"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("execwatch agent: error: --aggregation-window-max is gone: use")


def test_run_args_takes_a_value_that_starts_with_a_dash() -> None:
    """`--run-args --version`, as the seed's smoke test writes it, is the argv to try, not
    execwatch's own --version; the `=` form means the same."""
    for argv in (["--run-args", "--version"], ["--run-args=--version"]):
        words = cliargs.attach_values(["scan", "img.tar", "--run", *argv], {"--run-args"})
        args = build_parser("scan").parse_args(words)
        assert (args.run, args.run_args) == (True, "--version")
    assert cliargs.attach_values(["scan", "--run-args"], {"--run-args"}) == ["scan", "--run-args"]


def test_a_bare_run_args_at_the_end_is_one_line_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "execwatch.cli", "scan", "x", "--run-args"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--run-args: expected one argument" in proc.stderr
