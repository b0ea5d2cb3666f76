"""Write the demo vault's media: a small PDF and a WebVTT talk transcript.

Run `python examples/make_media.py` (needs fpdf2, from the `test` extra). The output is
byte-for-byte the same on every run, so the committed files only change with this script.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from fpdf import FPDF

MEDIA = Path(__file__).parent / "vault" / "media"
PDF_NAME = "sync-design-review.pdf"
VTT_NAME = "offline-sync-talk.vtt"
FIXED_DATE = dt.datetime(2026, 11, 9, 9, 0, tzinfo=dt.UTC)

PDF_PAGES: list[tuple[str, list[str]]] = [
    (
        "Fieldbook Sync - Design Review",
        [
            "Reviewers: Priya Raman, Tomasz Lindqvist, Ada Mensah. Date: 9 November 2026.",
            "Scope: the operation log, the merge rules for concurrent block edits, and the "
            "resume protocol for devices on poor links. The endpoints themselves are out of "
            "scope; they are described in the API notes.",
            "Verdict: approved with three changes, listed on page 3.",
        ],
    ),
    (
        "Merge rules",
        [
            "Every block edit is an operation stamped with a hybrid logical clock (HLC). The "
            "server orders accepted operations by sequence number; devices replay the log in "
            "that order.",
            "Two edits to different blocks never conflict. Two edits to the same block that "
            "were made without seeing each other keep both texts: the later HLC wins the block "
            "and the other becomes a conflict version shown beside it.",
            "Deletes are tombstones for 30 days so an offline device cannot resurrect a block "
            "that was removed while it was away.",
        ],
    ),
    (
        "Changes requested",
        [
            "1. Cap a resume batch at 500 operations or 2 MB, whichever comes first, so a "
            "satellite link never stalls on one huge response.",
            "2. Send photos as separate uploads referenced by hash; never inline them in an "
            "operation.",
            "3. Log the HLC drift per device and alert when it exceeds 5 minutes; drift that "
            "large means a device clock is wrong, not that the network is slow.",
        ],
    ),
]

# (start seconds, end seconds, text): a ten-minute talk, so the transcript has time sections.
TALK: list[tuple[float, float, str]] = [
    (0.0, 6.5, "Hi everyone, I'm Ada, and this talk is about offline-first sync for Fieldbook."),
    (6.5, 14.0, "Our users work in places where the network comes and goes."),
    (
        14.0,
        24.0,
        "A soil team can spend a whole day without signal and then upload everything "
        "from the car park.",
    ),
    (
        24.0,
        38.0,
        "So the first rule is simple: the device is the source of truth for what the person typed.",
    ),
    (
        38.0,
        52.0,
        "Nothing a person writes is ever thrown away, even when two people edit the same block.",
    ),
    (72.0, 86.0, "Let me show how the operation log works."),
    (86.0, 101.0, "Every change becomes an operation with a hybrid logical clock stamp."),
    (
        101.0,
        118.0,
        "The server gives each accepted operation a sequence number, and devices "
        "replay in that order.",
    ),
    (
        150.0,
        166.0,
        "What about conflicts? Two edits to the same block that did not see each "
        "other both survive.",
    ),
    (
        166.0,
        181.0,
        "The later clock wins the block, and the other text becomes a conflict version next to it.",
    ),
    (
        240.0,
        256.0,
        "Deletes are tombstones for thirty days, so a device that was away cannot "
        "bring a block back by accident.",
    ),
    (318.0, 334.0, "Now, resuming on bad links."),
    (
        334.0,
        352.0,
        "A resume asks for everything after the last sequence number the device has seen.",
    ),
    (352.0, 370.0, "We cap each batch at five hundred operations or two megabytes."),
    (
        420.0,
        438.0,
        "Photos travel separately and are referenced by hash, never inside an operation.",
    ),
    (
        540.0,
        556.0,
        "One last thing: watch clock drift. If a device is five minutes off, its clock is wrong.",
    ),
    (596.0, 604.0, "Thanks, and questions welcome."),
]


def make_pdf() -> bytes:
    doc = FPDF()
    doc.set_creation_date(FIXED_DATE)
    doc.set_title("Fieldbook Sync - Design Review")
    doc.set_author("Fieldbook team")
    for heading, paragraphs in PDF_PAGES:
        doc.add_page()
        doc.set_font("Helvetica", style="B", size=16)
        doc.multi_cell(0, 10, heading)
        doc.ln(4)
        doc.set_font("Helvetica", size=11)
        for paragraph in paragraphs:
            doc.multi_cell(0, 6, paragraph)
            doc.ln(3)
    return bytes(doc.output())


def timestamp(seconds: float) -> str:
    ms = round(seconds * 1000)
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


def make_vtt() -> str:
    lines = [
        "WEBVTT",
        "Kind: captions",
        "Language: en",
        "Title: Offline-first sync for Fieldbook",
        "Channel: Fieldbook Engineering",
        "",
    ]
    for start, end, text in TALK:
        lines += [f"{timestamp(start)} --> {timestamp(end)}", text, ""]
    return "\n".join(lines)


def main() -> None:
    MEDIA.mkdir(parents=True, exist_ok=True)
    (MEDIA / PDF_NAME).write_bytes(make_pdf())
    (MEDIA / VTT_NAME).write_text(make_vtt(), encoding="utf-8", newline="\n")
    for name in (PDF_NAME, VTT_NAME):
        print(f"wrote {MEDIA / name} ({(MEDIA / name).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
