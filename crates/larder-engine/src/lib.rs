//! larder-engine
