#!/usr/bin/env python3
"""Two ranks writing lines in pieces, for the launcher's output tests: rank 0's lines are cut
across os.write calls 0.4 s apart, rank 1 writes whole lines between them and ends without a
newline. Every launcher must pass through exactly: "0: step=1 loss=2.5", "0: step=2 loss=2.0",
"1: rank 1 says hello", "1: rank 1 ends without a newline" on stdout; "0: warning: slow" and
"1: e1" on stderr."""
import os
import time

if os.environ["CRUCIBLE_RANK"] == "0":
    os.write(1, b"step=1 loss=")
    time.sleep(0.4)
    os.write(1, b"2.5\nstep=2 ")
    time.sleep(0.4)
    os.write(1, b"loss=2.0\n")
    os.write(2, b"warn")
    time.sleep(0.4)
    os.write(2, b"ing: slow\n")
else:
    time.sleep(0.2)
    os.write(1, b"rank 1 says hello\n")
    time.sleep(0.4)
    os.write(1, b"rank 1 ends without a newline")
    os.write(2, b"e1\n")
