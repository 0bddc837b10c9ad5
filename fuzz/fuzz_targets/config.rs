//! Parsing a repository's `config` file must refuse or accept any bytes without
//! panicking, and whatever it accepts must encode back to a config that decodes to
//! the same value.
#![no_main]
use larder_store::RepoConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(config) = RepoConfig::decode(data, "fuzz") {
        let again = serde_json::to_vec(&config).expect("a config always serializes");
        assert_eq!(RepoConfig::decode(&again, "again").ok(), Some(config));
    }
});
