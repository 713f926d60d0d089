//! The embedded broker: librdkafka's in-process mock cluster, for zero-setup development, the
//! demo and tests. Clients in this process (and other processes, over TCP on loopback) use it
//! like a real broker. Its log lives as long as this value. It does not implement the admin
//! API's CreateTopics (topics are created here) nor offsets-for-times (prefixlog never uses it).
//!
//! With several brokers ([`EmbeddedKafka::start_replicated`]) every partition is replicated on
//! all of them (the mock keeps one log per partition, whichever broker leads it), so a broker
//! can be stopped ([`EmbeddedKafka::set_broker_reachable`]) and its partitions' leadership moved
//! to another ([`EmbeddedKafka::move_leaders`]): the mock has no controller, the caller plays
//! its part. Broker ids are `1..=brokers`.

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub struct EmbeddedKafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
    brokers: u8,
}

impl EmbeddedKafka {
    /// Starts a one-broker cluster with `topic` of `partitions` partitions.
    pub fn start(topic: &str, partitions: u32) -> Result<Self, rdkafka::error::KafkaError> {
        Self::start_replicated(topic, partitions, 1)
    }

    /// Starts a cluster of `brokers` brokers with `topic` of `partitions` partitions, each
    /// replicated on every broker; every partition is led by broker 1.
    pub fn start_replicated(
        topic: &str,
        partitions: u32,
        brokers: u8,
    ) -> Result<Self, rdkafka::error::KafkaError> {
        assert!(brokers >= 1, "a cluster has at least one broker");
        let cluster = MockCluster::new(i32::from(brokers))?;
        cluster.create_topic(topic, partitions as i32, i32::from(brokers))?;
        let kafka = Self { cluster, brokers };
        if brokers > 1 {
            kafka.move_leaders(topic, partitions, 1)?;
        }
        Ok(kafka)
    }

    /// How many brokers the cluster has.
    pub fn brokers(&self) -> u8 {
        self.brokers
    }

    /// Creates another topic.
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), rdkafka::error::KafkaError> {
        self.cluster.create_topic(topic, partitions as i32, i32::from(self.brokers))
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

    /// Stops broker `id` (connections dropped, new ones refused) or starts it again; its
    /// partitions stay led by it until [`Self::move_leaders`] moves them.
    pub fn set_broker_reachable(&self, id: u8, up: bool) -> Result<(), rdkafka::error::KafkaError> {
        assert!((1..=self.brokers).contains(&id), "broker {id} is not in 1..={}", self.brokers);
        if up {
            self.cluster.broker_up(i32::from(id))
        } else {
            self.cluster.broker_down(i32::from(id))
        }
    }

    /// Makes broker `id` the leader of every partition of `topic` (what a controller's
    /// election does when the old leader is gone).
    pub fn move_leaders(
        &self,
        topic: &str,
        partitions: u32,
        id: u8,
    ) -> Result<(), rdkafka::error::KafkaError> {
        assert!((1..=self.brokers).contains(&id), "broker {id} is not in 1..={}", self.brokers);
        for p in 0..partitions {
            self.cluster.partition_leader(topic, p as i32, Some(i32::from(id)))?;
        }
        Ok(())
    }
}
