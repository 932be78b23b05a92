"""How far a model's metrics moved on a newer version of the graph it was trained on (issue 47, "say
when to retrain").

``seeder evaluate --model M --artifacts NEW`` where NEW are the artifacts of an updated version of
M's graph (``seeder import ... --update``) evaluates M again, in the same run, on the artifacts it was
trained on (the location M records, or ``--baseline-artifacts``), on the same split with the same
settings, and prints the two side by side. The validation metrics M recorded at training are not used:
they come from a sample of the validation split under the training schedule, so they would not compare
with a full evaluation.

The rule (docs/updates.md "When to retrain"): retrain when Hit@1 on the updated version falls below
the same model's Hit@1 on the version it was trained on by more than ``RETRAIN_DROP`` and by more than
twice the standard error of that difference (``noise``), so that a small split does not call for a
retraining on chance alone.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from seeder.preprocessing.artifacts import open_artifacts
from seeder.system.io import DataError

RETRAIN_DROP = 0.02
"""Hit@1 lost on the updated version, against the trained version, above which to retrain."""

RULE = f"retrain when Hit@1 falls by more than {RETRAIN_DROP:.2f} and more than its noise (docs/updates.md, When to retrain)"


def noise(before: float, n_before: int, after: float, n_after: int) -> float:
    """Twice the standard error of the difference of two hit rates measured on ``n_before`` and
    ``n_after`` questions (as if independent: the two splits share most questions, so this errs high)."""
    variance = before * (1 - before) / max(n_before, 1) + after * (1 - after) / max(n_after, 1)
    return 2 * math.sqrt(variance)


def trained_artifacts(model: str, artifacts) -> dict[str, Any] | None:
    """The artifacts record (``seeder.policy.checkpoint.artifacts_record``) of ``model`` when ``artifacts``
    are those of a newer version of the graph it was trained on: the dataset's lineage holds the model's
    dataset, or the features were preprocessed from the model's by ``--update``. None otherwise."""
    from seeder.policy.checkpoint import locate, read_info  # imports torch: only on this path

    record = read_info(locate(model)).artifacts or {}
    trained, here = record.get("dataset_fingerprint"), artifacts.manifest.get("dataset_fingerprint")
    if not trained or not here or trained == here:
        return None
    features = (record.get("fingerprints") or {}).get("features")
    lineage = ((artifacts.manifest.get("update") or {}).get("parent") or {}).get("features_lineage") or []
    if trained in artifacts.dataset.lineage or (features and features in lineage):
        return record
    return None


def compared_metrics(ks: list[int]) -> list[tuple[str, str]]:
    """(key, label) of the metrics the comparison shows: Hit@ the smallest k, Recall@ the largest, MRR."""
    return [(f"hit_at_{min(ks)}", f"Hit@{min(ks)}"), (f"recall_at_{max(ks)}", f"Recall@{max(ks)}"), ("mrr", "MRR")]


def baseline_summary(report: dict[str, Any], method: str = "seeder") -> dict[str, Any]:
    """What the comparison keeps of an evaluation report of the trained version."""
    return {
        "artifacts": report["artifacts"],
        "split": report["split"],
        "queries": report["queries"],
        "metrics": report["methods"][method]["all"],
        "ceiling": report["ceiling"]["all"],
    }


def compare(report: dict[str, Any], baseline: dict[str, Any], ks: list[int], method: str = "seeder") -> dict[str, Any]:
    """Each compared metric before (trained version), after (this report) and the change; ``retrain``
    by the rule ``RETRAIN_DROP``."""
    after = report["methods"][method]["all"]
    rows = {}
    for key, label in compared_metrics(ks):
        rows[key] = {"label": label, "before": baseline["metrics"][key], "after": after[key]}
    rows["ceiling_recall_any"] = {
        "label": "ceiling Recall@any",
        "before": baseline["ceiling"]["recall_any"],
        "after": report["ceiling"]["all"]["recall_any"],
    }
    for row in rows.values():
        row["change"] = row["after"] - row["before"]
    hit = rows[f"hit_at_{min(ks)}"]
    margin = noise(hit["before"], baseline["queries"], hit["after"], report["queries"])
    return {
        "metrics": rows,
        "queries": {"before": baseline["queries"], "after": report["queries"]},
        "noise": margin,
        "retrain": bool(-hit["change"] > max(RETRAIN_DROP, margin)) if min(ks) == 1 else None,
        "rule": RULE,
    }


def format_comparison(comparison: dict[str, Any], baseline: dict[str, Any], split: str) -> str:
    """The comparison's table and its one-line verdict."""
    rows = comparison["metrics"]
    header = ["metric", "trained version", "updated version", "change"]
    table = [[row["label"], f"{row['before']:.4f}", f"{row['after']:.4f}", f"{row['change']:+.4f}"] for row in rows.values()]
    table.append(["questions", str(comparison["queries"]["before"]), str(comparison["queries"]["after"]), ""])
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = [f"\nthe same model on the version it was trained on ({baseline['artifacts']}, {split} split):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *table]]
    first = next(iter(rows.values()))
    verdict = {True: "retrain", False: "no need to retrain yet", None: "add 1 to eval.ks to apply it"}[comparison["retrain"]]
    lines.append(
        f"{first['label']} {first['before']:.3f} -> {first['after']:.3f} ({first['change']:+.3f}, noise "
        f"{comparison['noise']:.3f}) on the updated version; "
        f"{comparison['rule']}: {verdict}"
    )
    return "\n".join(lines)


def evaluate_against_trained_version(
    report: dict[str, Any], artifacts, model: str, baseline: str | None, ks: list[int], evaluate, log=print
) -> str | None:
    """Add ``baseline`` and ``comparison`` to ``report`` (of ``model`` on ``artifacts``) and return the
    text to print, or None when there is nothing to compare with. ``baseline``: the trained version's
    artifacts (None: where the model records them, compared only when ``artifacts`` are a newer version
    of its graph; ``"none"``: no comparison). ``evaluate(opened_artifacts)`` evaluates the model on
    other artifacts with this run's split and settings."""
    if "seeder" not in report["methods"] or (baseline or "").lower() == "none":
        return None
    if baseline is None:
        record = trained_artifacts(model, artifacts)
        if record is None or not record.get("path"):
            return None
        baseline = record["path"]
        try:
            opened = open_artifacts(baseline)
        except (DataError, OSError) as exc:
            note = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            log(
                f"no comparison with the version the model was trained on: its artifacts {baseline} cannot be "
                f"opened ({note}); pass --baseline-artifacts",
                file=sys.stderr,
            )
            return None
    else:
        opened = open_artifacts(baseline)
    log(f"evaluating the model on the version it was trained on too: {baseline}", file=sys.stderr)
    base = baseline_summary(evaluate(opened)) | {"artifacts": str(baseline)}
    base["dataset_fingerprint"] = opened.manifest.get("dataset_fingerprint")
    report["baseline"] = base
    report["comparison"] = compare(report, base, ks)
    return format_comparison(report["comparison"], base, report["split"])
