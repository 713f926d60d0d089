//! The embedded broker: librdkafka's in-process mock cluster, for zero-setup development, the
//! demo and tests. Clients in this process (and other processes, over TCP on loopback) use it
//! like a real broker. Its log lives as long as this value. It does not implement the admin
//! API's CreateTopics (topics are created here) nor offsets-for-times (prefixlog never uses it).

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub struct EmbeddedKafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl EmbeddedKafka {
    /// Starts a one-broker cluster with `topic` of `partitions` partitions.
    pub fn start(topic: &str, partitions: u32) -> Result<Self, rdkafka::error::KafkaError> {
        let cluster = MockCluster::new(1)?;
        cluster.create_topic(topic, partitions as i32, 1)?;
        Ok(Self { cluster })
    }

    /// Creates another topic.
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), rdkafka::error::KafkaError> {
        self.cluster.create_topic(topic, partitions as i32, 1)
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Takes the broker down (connections dropped, new ones refused) or brings it back: a broker
    /// outage for tests. The log is kept.
    pub fn set_reachable(&self, up: bool) -> Result<(), rdkafka::error::KafkaError> {
        if up {
            self.cluster.broker_up(-1)
        } else {
            self.cluster.broker_down(-1)
        }
    }
}
