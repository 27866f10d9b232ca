"""Process plumbing under everything but `ctl.compat`: what a user mistake is (`errors`:
`UserError`, one line on stderr and exit 2), what a run prints (`console`; TensorFlow's
devices listed at a command's start without the cuInit line on a host with no GPU:
`devices`), and how a command ends (`process_end`).
"""
