"""The scoring of kvsched_sanity.yaml: a hit when the reference answer appears in the completion as
a whole word (case-insensitive), so "8" is not found in "18"."""

import re


def process_results(doc, results):
    """lm-eval's per-document hook: `results[0]` is the generated text."""
    answer = re.escape(doc["answer"].strip())
    hit = re.search(rf"(?<![\w]){answer}(?![\w])", results[0], re.IGNORECASE)
    return {"contains": float(hit is not None)}
