"""The binding's error messages go through no std::ostream (binding.cpp, `message`): on the GPU
image an ostream-formatted number inside the JIT-built library ran a copy of libstdc++'s
ostream::_M_insert<long> with its own locale facet ids and killed the process instead of
raising (session 20). Every check in binding.cpp must take a string literal or message(...),
and nothing there may write to a stream."""
import re
from pathlib import Path

import pytest

BINDING = Path(__file__).resolve().parents[1] / "monarch_fftconv" / "csrc" / "binding.cpp"
CHECK = re.compile(r"\b(TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|TORCH_WARN\w*|AT_ERROR|AT_ASSERT\w*)\(")


def strip_comments(source: str) -> str:
    """The source with // and /* */ comments blanked (string literals kept)."""
    out, i, quote = [], 0, None
    while i < len(source):
        c = source[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(source[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
            out.append(c)
        elif source.startswith("//", i):
            while i < len(source) and source[i] != "\n":
                i += 1
            continue
        elif source.startswith("/*", i):
            i = source.index("*/", i) + 2
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def call_arguments(source: str, open_paren: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose '(' is at open_paren."""
    args, depth, start, quote, i = [], 0, open_paren + 1, None, open_paren
    while True:
        c = source[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(source[start:i].strip())
                return args
        elif c == "," and depth == 1:
            args.append(source[start:i].strip())
            start = i + 1
        i += 1


def message_violations(source: str) -> list[str]:
    """Every check whose message is not one string literal (or adjacent literals) or one
    message(...) call, and every stream write."""
    code = strip_comments(source)
    bad = []
    for match in CHECK.finditer(code):
        if match.group(1).startswith(("TORCH_INTERNAL_ASSERT", "TORCH_WARN", "AT_")):
            bad.append(f"{match.group(1)} (its message goes through an ostream)")
            continue
        args = call_arguments(code, match.end() - 1)
        text = args[1:]
        literal = len(text) == 1 and re.fullmatch(r'("(?:[^"\\]|\\.)*"\s*)+', text[0]) is not None
        built = len(text) == 1 and text[0].startswith("message(") and call_arguments(text[0], 7) is not None
        if not (literal or built):
            bad.append(f"{match.group(1)}({args[0][:50]}, ...): {len(text)} message parts, not a literal or message(...)")
    for stream in re.finditer(r"<<(?!<)|std::(?:o|i)?stringstream|std::c(?:out|err)|c10::str\(", code):
        line = code.count("\n", 0, stream.start()) + 1
        bad.append(f"line {line}: {stream.group(0)!r} writes to a stream")
    return bad


def test_every_binding_check_builds_its_message_without_a_stream():
    source = BINDING.read_text()
    assert len(CHECK.findall(strip_comments(source))) >= 20  # the binding's checks are all seen
    assert message_violations(source) == []


@pytest.mark.parametrize("check, reason", [
    ('TORCH_CHECK_VALUE(n > 0, "monarch_fftconv: n=", n);', "2 message parts"),
    ('TORCH_CHECK(ok, c10::str("n=", n));', "not a literal"),
    ('TORCH_INTERNAL_ASSERT(ok);', "ostream"),
    ('std::ostringstream s; s << n;', "writes to a stream"),
])
def test_the_rule_catches_a_formatted_message(check, reason):
    """The scan flags the forms that formatted numbers through an ostream, and passes the
    allowed ones (a literal, adjacent literals, message(...), a comment that mentions <<)."""
    allowed = ('TORCH_CHECK_VALUE(n > 0, "monarch_fftconv: n must be positive");\n'
               'TORCH_CHECK(ok, "a " "b");  // x << y in a comment\n'
               'TORCH_CHECK_TYPE(ok, message("n=", n, ", got ", t.sizes()));\n')
    assert message_violations(allowed) == []
    found = message_violations(allowed + check)
    assert found and any(reason in f for f in found), found
