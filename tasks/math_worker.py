"""Child process of `tasks.math_answers.MathVerifier`: runs math-verify, one JSON line per request.

Why a process: math-verify's own time limit is `signal.alarm`, which raises in any thread but the main
one (actors score rewards off the main thread) and cannot interrupt long C-level work; a child process
can always be killed. This file is run as a script, so it imports nothing from this project.

Protocol (stdin/stdout, UTF-8 JSON lines, no pickle): the worker first writes ``{"ready": true}``;
then for each request ``{"pred": str, "gold": str}`` (answer contents, without ``\\boxed``) it writes
``{"ok": bool}``. EOF on stdin ends it.
"""

import json
import logging
import sys


def main() -> None:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # silences the "timeout disabled" notes

    def check(pred: str, gold: str) -> bool:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
        return bool(g and p and verify(g, p, timeout_seconds=None))

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            ok = check(req["pred"], req["gold"])
        except Exception:  # math-verify raises on some malformed LaTeX: that answer is simply wrong
            ok = False
        print(json.dumps({"ok": ok}), flush=True)


if __name__ == "__main__":
    main()
