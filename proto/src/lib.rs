//! placeholder
pub mod v1 {
    tonic::include_proto!("prefixlog.v1");
}
