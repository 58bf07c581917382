"""What comparisons of recorded runs leave out."""

# fields of a run or evaluation record that differ between two runs of the same numbers: dates, commits, clocks
NOT_COMPARED = {"date", "code_commit", "train_seconds", "eval_seconds", "train_wall_s", "eval_wall_s"}
