"""A person forgets: a learning (learnings.py), or what they said, a turn or a whole session (turns.py,
which the rest serves: the line rules, the job rows, the files and their history, the backups)."""
