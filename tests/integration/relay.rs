//! The relay that lets Go's CRI clients that send the socket path as `:authority` reach the
//! fake runtime (`kruised_test_support::authority`, used by the fleet benchmark).

use kruised_test_support::authority::{END_HEADERS, no_dynamic_table, rewrite_headers};

#[test]
fn an_authority_literal_becomes_localhost_and_the_rest_stays() {
    // :method GET (indexed 2), :authority "/run/x.sock" with incremental indexing (0x41),
    // :path "/a" without indexing (name index 4)
    let mut block = vec![0x82, 0x41, 11];
    block.extend_from_slice(b"/run/x.sock");
    block.extend_from_slice(&[0x04, 2, b'/', b'a']);
    let out = rewrite_headers(&block, END_HEADERS).unwrap();
    let mut want = vec![0x82, 0x41, 9];
    want.extend_from_slice(b"localhost");
    want.extend_from_slice(&[0x04, 2, b'/', b'a']);
    assert_eq!(out, want);
}

#[test]
fn a_block_cut_short_is_left_as_it_is() {
    // an :authority literal whose value claims more bytes than the frame holds
    assert_eq!(rewrite_headers(&[0x41, 20, b'x'], END_HEADERS), None);
}

#[test]
fn the_servers_settings_announce_no_dynamic_table() {
    let settings = [0, 1, 0, 0, 0x10, 0, 0, 3, 0, 0, 0, 100];
    assert_eq!(
        no_dynamic_table(&settings),
        [0, 3, 0, 0, 0, 100, 0, 1, 0, 0, 0, 0]
    );
}
