"""The README's Python example (its one ```python block) runs against the built module: it serves its
request to the end through the serving loop, and its block hashes are one per full page of the prompt."""

import contextlib
import io
import pathlib
import signal

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def fenced_block(markdown, lang):
    """The body of the one fenced block whose info string is `lang`."""
    blocks, current = [], None
    for line in markdown.splitlines():
        if current is None:
            if line.rstrip() == "```" + lang:
                current = []
        elif line.rstrip() == "```":
            blocks.append("\n".join(current) + "\n")
            current = None
        else:
            current.append(line)
    assert current is None, "an unclosed ```" + lang + " block"
    assert len(blocks) == 1, "the README must hold exactly one ```%s block, not %d" % (lang, len(blocks))
    return blocks[0]


def test_the_extractor_takes_the_one_python_block():
    md = "text\n```python\nx = 1\n```\n```sh\nls\n```\n"
    assert fenced_block(md, "python") == "x = 1\n"


def test_the_readme_python_example_serves_its_request():
    source = fenced_block(README.read_text(encoding="utf-8"), "python")
    namespace = {"__name__": "readme_example"}
    stdout = io.StringIO()

    def too_long(signum, frame):
        raise AssertionError("the README's Python loop did not end within 60 s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(60)
    try:
        with contextlib.redirect_stdout(stdout):
            exec(compile(source, str(README) + ":python", "exec"), namespace)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

    assert "served 1 request" in stdout.getvalue()
    s = namespace["s"]
    assert len(s) == 0, "the request was finished and left the scheduler"
    assert namespace["made"] >= 16
    # One hash per full page of the prompt's tokens (the last, partial page has none).
    tokens = namespace["tokens"]
    assert len(namespace["block_hashes"]) == len(tokens) // 32
    assert all(0 <= h < 2**64 for h in namespace["block_hashes"])
