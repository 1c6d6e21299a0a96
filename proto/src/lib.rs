//! The platform connector wire contract (`datamodels.PlatformConnector`).
