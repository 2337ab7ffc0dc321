//! The API-server double (being written).
