"""What a client of Hoist's manager needs: the connection with its errors and the user's
identity (``connection``), a session's log (``session_log``) and one event as data
(``events``). The CLI and the web view are both built on it; neither imports the other."""
