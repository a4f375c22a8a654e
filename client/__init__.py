"""The client side of a node: the HTTP client library, DM encryption and key files, user commands.

``http`` (``ChatsyncClient``, a synchronous client of the node's HTTP API that re-checks what it
reads), ``e2e`` (the user key file and end-to-end encrypted DMs), ``commands`` (``chatsync
keygen / publish / send / history / status``), ``shell`` (what the commands share: one-line
failures, key files), ``posting`` (the text to post, a held or refused post said),
``display`` (short ids, previews, ``--json``). Imports ``store`` only, never ``node``.
"""
