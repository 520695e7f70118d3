"""`cbbench gate`: an A/B regression gate that needs no stored baseline. Two trees of the repository (or two running
servers) are measured in one job, interleaved, each run a fresh process of its own tree's code, and decided per
configuration and metric by a stated test (docs/gate.md)."""
