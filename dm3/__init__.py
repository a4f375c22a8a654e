"""dm3 interop, pure: its cryptography (``crypto``), envelopes and JSON-RPC (``envelope``),
names (``names``) and storage containers (``containers``). The node's gateway
(``node/api/dm3.py``) and the client's export/import use it."""
