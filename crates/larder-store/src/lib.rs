//! larder-store
