//! Go-compatible hashing (being written).
