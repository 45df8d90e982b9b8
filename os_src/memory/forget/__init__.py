"""A person forgets: a learning (learnings.py), or what they said, a turn or a whole session (turns.py,
which the rest serves: the line rules and their judge, the session's context, the job rows, memory.db's
purge, the files and their history, the backups)."""
