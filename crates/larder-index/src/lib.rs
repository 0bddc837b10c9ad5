//! larder-index
