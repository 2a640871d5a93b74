//! A controllable HTTP/1.1 artifact server on loopback (filled in below).
