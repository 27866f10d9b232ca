"""Process plumbing under everything but `ctl.compat`: what a user mistake is (`errors`:
`UserError`, one line on stderr and exit 2), what a run prints (`console`), and how a
command ends (`process_end`).
"""
