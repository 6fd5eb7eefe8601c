"""Optimizer-batch replay: one update on a verified capture (`runner`), the check table without a
model (`explain`), gates A and B over a capture and its replays (`evidence`), and repeated fresh
replays (`repeat`). The capture format itself is `twinrun.capture`."""
