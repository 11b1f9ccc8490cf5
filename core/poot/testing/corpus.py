"""A text corpus for tokenizer tests: hand-picked hard cases and random mixtures of them."""

from __future__ import annotations

import numpy as np

__all__ = ["SEEDS", "text_corpus"]

SEEDS: dict[str, list[str]] = {
    "unicode": [
        "héllo wörld",
        "Ünïcödé ñ ç ø å",
        "e\u0301 combining",
        "ﬁ ligature",
        "Ελληνικά κείμενο",
        "русский текст",
        "עברית מימין לשמאל",
        "العربية",
        "हिन्दी देवनागरी",
        "ไทย",
        "ẞ ß ǅ",
        "\u00a0nbsp\u00a0",
        "zero\u200bwidth",
        "\ufeffbom",
    ],
    "emoji": ["🤖", "👍🏽", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵 flags", "❤️ ok", "🙂🙃😉", "⭐️✨", "🧑🏿‍🚀"],
    "cjk": ["中文测试，标点。", "日本語のテキストです", "ひらがなカタカナ", "한국어 텍스트", "漢字かな交じり文", "「引用」『二重』", "全角ＡＢＣ１２３"],
    "code": [
        "def f(x):\n    return x**2  # square",
        "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
        '{"key": [1, 2.5, null, true], "s": "v"}',
        '<div class="x">&amp;</div>',
        "SELECT * FROM t WHERE id = 42;",
        "x => x.map(y => y * 2)",
        "#include <stdio.h>\nint main(){}",
        "    \tindented\n\t\tcode",
    ],
    "whitespace": [
        " ",
        "  ",
        "   three",
        "\t",
        "\n",
        "\n\n\n",
        "\r\n",
        "a  b   c    d",
        " leading",
        "trailing ",
        "\t \n \t",
        "     ",
        "line\n  indented\n\tTab",
    ],
    "digits": [
        "0",
        "7",
        "42",
        "1234567890",
        "3.14159265",
        "-0.001",
        "1e10",
        "12,345,678.90",
        "+1 (555) 123-4567",
        "2026-11-29T16:05:02Z",
        "000123",
        "٣٤٥ arabic digits",
    ],
    "words": [
        "Hello world!",
        "The quick brown fox jumps over the lazy dog.",
        "don't won't it's",
        "CamelCaseWords and snake_case_words",
        "UPPER lower MiXeD",
        "a",
        "I",
        "multi-word sentence, with punctuation; and more: yes!",
        "??!!..,,",
        "'quoted' \"double\"",
    ],
}


def text_corpus(rng: np.random.Generator, specials: list[str], n: int = 2000) -> list[str]:
    """Every seed, every special token alone and embedded, then random mixtures up to ``n`` strings."""
    pool = [s for group in SEEDS.values() for s in group]
    out = list(pool)
    for sp in specials:
        out += [sp, f"text {sp} more", f"{sp}{sp}", f"\n{sp}\n"]
    seps = ["", " ", "  ", "\n", "\t", ", "]
    while len(out) < n:
        k = int(rng.integers(2, 6))
        parts = [pool[int(i)] for i in rng.integers(0, len(pool), size=k)]
        if specials and rng.random() < 0.3:
            parts.insert(int(rng.integers(0, k + 1)), specials[int(rng.integers(0, len(specials)))])
        text = ""
        for p in parts:
            text += p + seps[int(rng.integers(0, len(seps)))]
        if rng.random() < 0.2:  # cut anywhere, even inside a grapheme cluster
            text = text[: int(rng.integers(0, len(text) + 1))]
        out.append(text)
    return out[: max(n, len(out))]
