"""The scan's check names are Reason, spelled: one table, read both ways."""

from __future__ import annotations

from execwatch.record import Reason
from execwatch.scan.vocabulary import CHECK_OF_REASON, REASON_OF_CHECK, SCAN_ONLY, Check


def test_every_reason_the_scan_reports_has_exactly_one_check_name() -> None:
    assert len(set(CHECK_OF_REASON.values())) == len(CHECK_OF_REASON)
    for reason, check in CHECK_OF_REASON.items():
        assert REASON_OF_CHECK[check] is reason


def test_every_check_name_spells_one_reason_or_is_the_scans_own() -> None:
    for check in Check:
        assert (check in REASON_OF_CHECK) != (check in SCAN_ONLY), check
    assert frozenset(
        {Check.NOT_STATIC, Check.SHEBANG_CRLF, Check.ENV_NOT_ON_PATH,
         Check.RUN_STARTED, Check.RUN_FAILED}
    ) == SCAN_ONLY  # fmt: skip


def test_the_spellings_of_the_stable_reasons() -> None:
    """The JSON, SARIF and JUnit names of the reasons the scan predicts."""
    assert {str(r): str(c) for r, c in CHECK_OF_REASON.items()} == {
        "ForeignArchitecture": "arch-mismatch",
        "ForeignOS": "foreign-os",
        "MissingInterpreter": "missing-interpreter",
        "BadInterpreter": "bad-interpreter",
        "MissingLibrary": "missing-library",
        "MissingSymbolVersion": "missing-symbol-version",
        "MissingSymbol": "missing-symbol",
        "LibcMismatch": "libc-mismatch",
        "MissingShebangInterpreter": "missing-shebang-interpreter",
        "MissingShebang": "missing-shebang",
        "NotFound": "missing-entrypoint",
        "CorruptBinary": "corrupt-binary",
        "UnsupportedCPU": "cpu-level",
        "StartupCrash": "startup-crash",
    }
    assert set(Reason) - set(CHECK_OF_REASON) == {
        Reason.NO_SHEBANG, Reason.PERMISSION_DENIED, Reason.UNDIAGNOSED,
        Reason.BENIGN_EXIT, Reason.EMULATED,
    }  # fmt: skip
