"""Great Expectations plumbing of the data checks (GX Core 1.x): one ephemeral context per
report, one validation definition per suite, re-run on each frame (GX creates the batch from the
dataframe passed at run time); each GX result becomes a :class:`~pipeline.checks.report.CheckResult`;
the Data Docs HTML site is built byte-identical on a rebuild (a DVC output)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.checks.report import CheckResult, failed_check, jsonable, preview

# What a process that runs suites imports (slow: ~5 CPU-s); local workers preload it once (engine.process_context).
GX_MODULES = ("great_expectations", "great_expectations.expectations")


def import_gx() -> None:
    """Import Great Expectations on this thread now: a process pool's result thread unpickling a
    report that holds GX objects must not race the main thread's first import of it."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in GX_MODULES:
            importlib.import_module(name)


class GX:
    def __init__(self) -> None:
        import logging
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import great_expectations as gx
            import great_expectations.expectations as gxe
            from great_expectations.data_context.types.base import (
                DataContextConfig,
                InMemoryStoreBackendDefaults,
                ProgressBarsConfig,
            )

        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        self.gx, self.gxe = gx, gxe
        # In-memory stores without the default temporary Data Docs site, no "Calculating Metrics"
        # progress bars, no analytics.
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            progress_bars=ProgressBarsConfig(globally=False),
            analytics_enabled=False,
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        asset = self.context.data_sources.add_pandas("bertrace").add_dataframe_asset("frame")
        self.batch_definition = asset.add_batch_definition_whole_dataframe("whole frame")
        self.definitions: list[SuiteRun] = []

    def definition(self, name: str, expectations: list) -> "SuiteRun":
        suite = self.context.suites.add(self.gx.ExpectationSuite(name=name, expectations=expectations))
        vd = self.context.validation_definitions.add(
            self.gx.ValidationDefinition(name=name, data=self.batch_definition, suite=suite)
        )
        self.definitions.append(SuiteRun(vd, [e.id for e in suite.expectations]))
        return self.definitions[-1]

    def kept(self) -> list:
        """The suite results worth a Data Docs page (see :attr:`SuiteRun.kept`)."""
        return [r for d in self.definitions for r in d.kept]


@dataclass
class SuiteRun:
    vd: Any
    order: list[str]
    # Suite results for the Data Docs site: every failed run, and a suite's first run (what it checks);
    # passing reruns on other shards / chunks add nothing to look at.
    kept: list = field(default_factory=list)

    def run(
        self,
        frame,
        *,
        params: dict | None = None,
        samples: int = 5,
        complete: bool = False,
        run_name: str | None = None,
    ) -> list:
        """Validate ``frame`` (``run_name``: the file or split it came from, the Data Docs page's
        title); the GX results in suite order."""
        res = self.validate(frame, params=params, samples=samples, complete=complete, run_name=run_name)
        if not res.success or not self.kept:
            self.kept.append(res)
        return self.ordered(res)

    def validate(
        self,
        frame,
        *,
        params: dict | None = None,
        samples: int = 5,
        complete: bool = False,
        run_name: str | None = None,
        result_format: dict | None = None,
    ):
        """One GX run of the suite on ``frame``: the suite result, not kept (``result_format``
        replaces the SUMMARY / COMPLETE one that ``samples`` and ``complete`` make)."""
        import warnings

        from great_expectations.core.run_identifier import RunIdentifier

        fmt = result_format or {
            "result_format": "COMPLETE" if complete else "SUMMARY",
            "partial_unexpected_count": samples,
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.vd.run(
                batch_parameters={"dataframe": frame},
                expectation_parameters=params or {},
                result_format=fmt,
                run_id=RunIdentifier(run_name=_page_name(run_name)) if run_name else None,
            )

    def ordered(self, res) -> list:
        """The expectation results of a suite result, in suite order."""
        pos = {eid: i for i, eid in enumerate(self.order)}
        return sorted(res.results, key=lambda r: pos.get(r.expectation_config.id, len(pos)))

    @property
    def configurations(self) -> list:
        """The suite's expectation configurations, in suite order."""
        return [e.configuration for e in self.vd.suite.expectations]


_EPOCH = __import__("datetime").datetime(1970, 1, 1, tzinfo=__import__("datetime").timezone.utc)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _page_name(target: str) -> str:
    """A run name GX's filesystem store takes (no ``/`` or ``\\``): path separators become ``∕``."""
    return str(target).replace("/", "\u2215").replace("\\", "\u2215")


def build_data_docs(gx_results: list, directory: str | Path) -> Path:
    """The Great Expectations Data Docs HTML site of ``gx_results`` (suite validation results:
    :attr:`ValidationReport.gx_results`) in ``directory``; returns its ``index.html``.

    A filesystem site (GX 1.x ``data_docs_sites``, ``SiteBuilder`` with a ``TupleFilesystemStoreBackend``)
    on a fresh ephemeral context: one page per result, titled with the file or split checked (the run
    name), listing each expectation with its observed value and, for a failed one, the unexpected
    values GX sampled. ``directory`` is replaced."""
    import copy
    import shutil
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import great_expectations as gx
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False),
        analytics_enabled=False,
        data_docs_sites={
            "bertrace": {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(tmp.resolve())},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
    )
    # GX formats run times in the local time zone: UTC here gives the same bytes in every zone.
    with warnings.catch_warnings(), _utc_clock():
        warnings.simplefilter("ignore")
        context = gx.get_context(mode="ephemeral", project_config=config)
        store = context.validation_results_store
        for res in gx_results:
            # Byte-identical on a rebuild (a cached DVC output that downstream records name by md5): the
            # page's run time is fixed (the Unix epoch) and GX's random ids are replaced by stable ones.
            run_id = RunIdentifier(run_name=res.meta["run_id"].run_name, run_time=_EPOCH)
            res = copy.deepcopy(res)
            res.meta.update(run_id=run_id, validation_time=_EPOCH, validation_id=None, checkpoint_id=None)
            if isinstance(res.meta.get("batch_markers"), dict) and "ge_load_time" in res.meta["batch_markers"]:
                res.meta["batch_markers"] = {**res.meta["batch_markers"], "ge_load_time": "19700101T000000.000000Z"}
            for r in res.results:
                r.expectation_config.id = None
            key = ValidationResultIdentifier(
                expectation_suite_identifier=ExpectationSuiteIdentifier(name=res.suite_name),
                run_id=run_id,
                batch_identifier="frame",
            )
            store.set(key, res)
        context.build_data_docs(site_names=["bertrace"])
    for page in tmp.rglob("*.html"):  # what the renderer itself makes up: a cache-busting time, random ids
        text = re.sub(r"\?d=\d{8}T\d{6}\.\d+Z", "", page.read_text(encoding="utf-8"))
        ids: dict[str, str] = {}
        text = _UUID.sub(lambda m: ids.setdefault(m.group(0), f"{len(ids):08d}-0000-4000-8000-000000000000"), text)  # noqa: B023 (called within the iteration)
        page.write_text(text, encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory / "index.html"


@contextlib.contextmanager
def _utc_clock():
    """The process's local time zone set to UTC while the body runs (``TZ`` and ``time.tzset``)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


def expectation_name(r) -> str:
    cfg = r.expectation_config
    kw = cfg.kwargs
    if "column" in kw:
        return f"{cfg.type}({kw['column']})"
    if "column_A" in kw:
        return f"{cfg.type}({kw['column_A']}, {kw['column_B']})"
    return cfg.type


def to_check(r, target: str, sample: Callable[[int, Any], dict] | None = None) -> CheckResult:
    """A GX ExpectationValidationResult as a CheckResult; ``sample(row, value)`` describes a bad row."""
    res = r.result or {}
    name = expectation_name(r)
    why = r.expectation_config.description or ""
    info = r.exception_info or {}
    if info and "raised_exception" not in info:  # keyed by metric when run as part of a suite
        info = next((v for v in info.values() if isinstance(v, dict) and v.get("raised_exception")), {})
    if info.get("raised_exception"):
        return failed_check(target, name, f"{why}: GX raised {info.get('exception_message')}")
    if "observed_value" in res:  # aggregate expectation (row count, mean, sum, column set)
        observed = res["observed_value"]
        if "details" in res:
            observed = {"columns": observed, **res["details"]}
        return CheckResult(target, name, bool(r.success), observed, 0, [], why)
    rows = res.get("partial_unexpected_index_list") or []
    values = res.get("partial_unexpected_list") or []
    sample_rows = []
    for i, v in zip(rows, values):
        sample_rows.append(
            sample(int(i), v) if sample else {"row": int(i), "value": preview(v) if isinstance(v, str) else v}
        )
    observed = {
        "rows": res.get("element_count"),
        "unexpected_values": [
            {"value": preview(c["value"]) if isinstance(c["value"], str) else c["value"], "count": c["count"]}
            for c in res.get("partial_unexpected_counts") or []
        ],
    }
    return CheckResult(
        target,
        name,
        bool(r.success),
        jsonable(observed),
        int(res.get("unexpected_count") or 0),
        jsonable(sample_rows),
        why,
    )
