//! The `PrefixIndex` gRPC trait, served by [`QueryService`]: each RPC is a call of the service
//! (unary `Match`, `Describe`, `ListWorkers`) or of [`crate::stream`] (`MatchStream`). Apart
//! from the service so that the stream, which works on the service, and the service do not
//! import each other.

use crate::service::{grpc_timeout, QueryService};
use crate::stream;
use prefixlog_proto::v1::prefix_index_server::PrefixIndex;
use prefixlog_proto::v1::{
    DescribeRequest, DescribeResponse, ListWorkersRequest, ListWorkersResponse, MatchRequest, MatchResponse,
};
use std::time::Instant;
use tonic::{Request, Response, Status, Streaming};

#[tonic::async_trait]
impl PrefixIndex for QueryService {
    async fn r#match(&self, request: Request<MatchRequest>) -> Result<Response<MatchResponse>, Status> {
        let wait = self.wait_budget(grpc_timeout(&request));
        self.answer(request.into_inner(), wait).await.map(Response::new)
    }

    async fn describe(&self, _: Request<DescribeRequest>) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(QueryService::describe(self)))
    }

    async fn list_workers(
        &self,
        _: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        Ok(Response::new(QueryService::list_workers(self)))
    }

    type MatchStreamStream = stream::MatchStream;

    async fn match_stream(
        &self,
        request: Request<Streaming<MatchRequest>>,
    ) -> Result<Response<Self::MatchStreamStream>, Status> {
        let permit = self.stream_permit()?;
        // The stream's deadline bounds every message's token wait, as a unary call's does.
        let (opened, timeout) = (Instant::now(), grpc_timeout(&request));
        Ok(Response::new(stream::serve(self.clone(), request.into_inner(), opened, timeout, permit)))
    }
}
