"""The RESULT_JSON record that bench_train (and the PyTorch baseline) print at the end of a run."""
import json


def result_json(path):
    """The RESULT_JSON object of the log at `path` (a launcher's `[rank N] ` prefix allowed), or
    None when the file is missing or has none (a failed run)."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                i = line.find("RESULT_JSON ")
                if i >= 0:
                    return json.loads(line[i + len("RESULT_JSON "):])
    except OSError:
        pass
    return None
