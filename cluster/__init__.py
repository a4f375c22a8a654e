"""Local multi-process clusters: N ``chatsync node run`` processes on loopback, and a scripted scenario.

``local`` (``Cluster``: start, stop, kill, restart, partition, wait for convergence),
``scenario`` (the README's main job: post, cut a node off, heal, show equal roots),
``cli`` (``chatsync cluster``). Talks to nodes over HTTP and imports ``store`` only.
"""
