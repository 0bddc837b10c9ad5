//! etcd's users and roles for a cluster (docs/design/cluster.md, "Security", "etcd"):
//! etcd takes a client certificate's common name as its user. The administrator's
//! etcd certificate names `root` (etcd's root user); every node's names
//! [`NODE_USER`], whose role reads and writes the cluster's prefix and nothing else.

use etcd_client::{Client, Permission, UserAddOptions};

use super::client::{connect_options, EtcdOptions};
use super::CoordError;

/// The etcd user (a node's etcd certificate's common name) of every node.
pub const NODE_USER: &str = "larder-node";
/// etcd's root user: the administrator's etcd certificate's common name.
pub const ROOT_USER: &str = "root";

/// Makes etcd's root user and [`NODE_USER`] (no passwords: they authenticate by their
/// certificates), the role [`NODE_USER`] with read and write on `prefix` only, and
/// turns authentication on. Run with the administrator's certificate; what exists
/// already is kept, so a second run changes nothing.
pub async fn enable_auth(
    endpoints: &[String],
    prefix: &str,
    options: &EtcdOptions,
) -> Result<(), CoordError> {
    let mut prefix = prefix.to_string();
    if !prefix.ends_with('/') {
        prefix.push('/');
    }
    let failed = |operation: &str| {
        let endpoints = endpoints.to_vec();
        let operation = operation.to_string();
        move |source| CoordError::Etcd {
            operation,
            endpoints,
            source,
        }
    };
    let mut client = Client::connect(endpoints, Some(connect_options(options)))
        .await
        .map_err(failed("connect"))?;
    for user in [ROOT_USER, NODE_USER] {
        let added = client
            .user_add(user, "", Some(UserAddOptions::new().with_no_pwd()))
            .await;
        existing_is_fine(added).map_err(failed("user add"))?;
    }
    let granted = client.user_grant_role(ROOT_USER, "root").await;
    existing_is_fine(granted).map_err(failed("grant the root role"))?;
    existing_is_fine(client.role_add(NODE_USER).await).map_err(failed("role add"))?;
    client
        .role_grant_permission(NODE_USER, Permission::read_write(prefix).with_prefix())
        .await
        .map_err(failed("grant the nodes' role its prefix"))?;
    let granted = client.user_grant_role(NODE_USER, NODE_USER).await;
    existing_is_fine(granted).map_err(failed("grant the nodes' role"))?;
    client.auth_enable().await.map_err(failed("auth enable"))?;
    Ok(())
}

/// `Ok` for an answer that the user or role, or its grant, exists already.
fn existing_is_fine<T>(result: Result<T, etcd_client::Error>) -> Result<(), etcd_client::Error> {
    match result {
        Err(etcd_client::Error::GRpcStatus(status))
            if status.code() == tonic::Code::FailedPrecondition
                && status.message().contains("already") =>
        {
            Ok(())
        }
        other => other.map(drop),
    }
}
