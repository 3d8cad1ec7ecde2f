from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_OK: _ClassVar[StatusCode]
    STATUS_UNKNOWN: _ClassVar[StatusCode]
    STATUS_SEGMENT_NOT_FOUND: _ClassVar[StatusCode]
    STATUS_IDENTITY_CONFLICT: _ClassVar[StatusCode]
    STATUS_NO_SPACE: _ClassVar[StatusCode]
    STATUS_INVALID_KEY: _ClassVar[StatusCode]
    STATUS_INVALID_ARGUMENT: _ClassVar[StatusCode]
    STATUS_INVALID_VALUE: _ClassVar[StatusCode]
    STATUS_BUFFER_TOO_SMALL: _ClassVar[StatusCode]
    STATUS_OBJECT_BUSY: _ClassVar[StatusCode]
    STATUS_OBJECT_NOT_FOUND: _ClassVar[StatusCode]
    STATUS_OBJECT_HAS_LEASE: _ClassVar[StatusCode]
    STATUS_GRANT_EXPIRED: _ClassVar[StatusCode]
    STATUS_REPLICA_UNAVAILABLE: _ClassVar[StatusCode]
    STATUS_IDENTITY_MISMATCH: _ClassVar[StatusCode]
    STATUS_OBJECT_CONFLICT: _ClassVar[StatusCode]
    STATUS_DATA_PATH: _ClassVar[StatusCode]
    STATUS_CHECKSUM_MISMATCH: _ClassVar[StatusCode]
    STATUS_ACCESS_DENIED: _ClassVar[StatusCode]
    STATUS_RPC: _ClassVar[StatusCode]
    STATUS_MASTER_TIMEOUT: _ClassVar[StatusCode]
    STATUS_TLS: _ClassVar[StatusCode]
    STATUS_MASTER_UNAVAILABLE: _ClassVar[StatusCode]
STATUS_OK: StatusCode
STATUS_UNKNOWN: StatusCode
STATUS_SEGMENT_NOT_FOUND: StatusCode
STATUS_IDENTITY_CONFLICT: StatusCode
STATUS_NO_SPACE: StatusCode
STATUS_INVALID_KEY: StatusCode
STATUS_INVALID_ARGUMENT: StatusCode
STATUS_INVALID_VALUE: StatusCode
STATUS_BUFFER_TOO_SMALL: StatusCode
STATUS_OBJECT_BUSY: StatusCode
STATUS_OBJECT_NOT_FOUND: StatusCode
STATUS_OBJECT_HAS_LEASE: StatusCode
STATUS_GRANT_EXPIRED: StatusCode
STATUS_REPLICA_UNAVAILABLE: StatusCode
STATUS_IDENTITY_MISMATCH: StatusCode
STATUS_OBJECT_CONFLICT: StatusCode
STATUS_DATA_PATH: StatusCode
STATUS_CHECKSUM_MISMATCH: StatusCode
STATUS_ACCESS_DENIED: StatusCode
STATUS_RPC: StatusCode
STATUS_MASTER_TIMEOUT: StatusCode
STATUS_TLS: StatusCode
STATUS_MASTER_UNAVAILABLE: StatusCode

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReplicaLocation(_message.Message):
    __slots__ = ("node_id", "segment_id", "endpoint", "shm_socket", "offset", "size_bytes", "grant", "tier", "grpc_endpoint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SHM_SOCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    GRPC_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_id: int
    endpoint: str
    shm_socket: str
    offset: int
    size_bytes: int
    grant: bytes
    tier: str
    grpc_endpoint: str
    def __init__(self, node_id: _Optional[str] = ..., segment_id: _Optional[int] = ..., endpoint: _Optional[str] = ..., shm_socket: _Optional[str] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., grant: _Optional[bytes] = ..., tier: _Optional[str] = ..., grpc_endpoint: _Optional[str] = ...) -> None: ...

class PutStartItem(_message.Message):
    __slots__ = ("key", "size_bytes", "replicas", "fingerprint", "parent_key", "tag", "pin", "pin_ttl_s", "soft_pin_ttl_s", "preferred_nodes", "attempt", "retry")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    PIN_TTL_S_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_TTL_S_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_NODES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    key: str
    size_bytes: int
    replicas: int
    fingerprint: bytes
    parent_key: str
    tag: bytes
    pin: bool
    pin_ttl_s: float
    soft_pin_ttl_s: float
    preferred_nodes: _containers.RepeatedScalarFieldContainer[str]
    attempt: int
    retry: int
    def __init__(self, key: _Optional[str] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ..., fingerprint: _Optional[bytes] = ..., parent_key: _Optional[str] = ..., tag: _Optional[bytes] = ..., pin: _Optional[bool] = ..., pin_ttl_s: _Optional[float] = ..., soft_pin_ttl_s: _Optional[float] = ..., preferred_nodes: _Optional[_Iterable[str]] = ..., attempt: _Optional[int] = ..., retry: _Optional[int] = ...) -> None: ...

class PutStartResult(_message.Message):
    __slots__ = ("status", "already_exists", "replicas", "existing_checksum", "has_existing_checksum")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    HAS_EXISTING_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    status: Status
    already_exists: bool
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaLocation]
    existing_checksum: int
    has_existing_checksum: bool
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., already_exists: _Optional[bool] = ..., replicas: _Optional[_Iterable[_Union[ReplicaLocation, _Mapping]]] = ..., existing_checksum: _Optional[int] = ..., has_existing_checksum: _Optional[bool] = ...) -> None: ...

class BatchPutStartRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutStartItem]
    def __init__(self, items: _Optional[_Iterable[_Union[PutStartItem, _Mapping]]] = ...) -> None: ...

class BatchPutStartResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutStartResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutStartResult, _Mapping]]] = ...) -> None: ...

class PutEndItem(_message.Message):
    __slots__ = ("key", "checksum", "failed_segments", "generation")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    FAILED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    key: str
    checksum: int
    failed_segments: _containers.RepeatedScalarFieldContainer[int]
    generation: int
    def __init__(self, key: _Optional[str] = ..., checksum: _Optional[int] = ..., failed_segments: _Optional[_Iterable[int]] = ..., generation: _Optional[int] = ...) -> None: ...

class BatchPutEndRequest(_message.Message):
    __slots__ = ("items", "next")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutEndItem]
    next: _containers.RepeatedCompositeFieldContainer[LeaseRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[PutEndItem, _Mapping]]] = ..., next: _Optional[_Iterable[_Union[LeaseRequest, _Mapping]]] = ...) -> None: ...

class PutEndResult(_message.Message):
    __slots__ = ("status", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    replicas: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., replicas: _Optional[int] = ...) -> None: ...

class BatchPutEndResponse(_message.Message):
    __slots__ = ("results", "leases")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutEndResult]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, results: _Optional[_Iterable[_Union[PutEndResult, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class KeysRequest(_message.Message):
    __slots__ = ("keys", "fingerprint", "unless_leased", "generations")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    UNLESS_LEASED_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: bytes
    unless_leased: bool
    generations: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[bytes] = ..., unless_leased: _Optional[bool] = ..., generations: _Optional[_Iterable[int]] = ...) -> None: ...

class KeyRequest(_message.Message):
    __slots__ = ("key", "fingerprint")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    key: str
    fingerprint: bytes
    def __init__(self, key: _Optional[str] = ..., fingerprint: _Optional[bytes] = ...) -> None: ...

class StatusesResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[Status]
    def __init__(self, statuses: _Optional[_Iterable[_Union[Status, _Mapping]]] = ...) -> None: ...

class ReplicaListResult(_message.Message):
    __slots__ = ("status", "size_bytes", "checksum", "replicas", "lease_ttl_s", "tag", "parent_key")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    status: Status
    size_bytes: int
    checksum: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaLocation]
    lease_ttl_s: float
    tag: bytes
    parent_key: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaLocation, _Mapping]]] = ..., lease_ttl_s: _Optional[float] = ..., tag: _Optional[bytes] = ..., parent_key: _Optional[str] = ...) -> None: ...

class BatchGetReplicaListResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ReplicaListResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ReplicaListResult, _Mapping]]] = ...) -> None: ...

class ExistsResult(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    def __init__(self, exists: _Optional[bool] = ...) -> None: ...

class PrefixMatchResponse(_message.Message):
    __slots__ = ("matched",)
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    matched: int
    def __init__(self, matched: _Optional[int] = ...) -> None: ...

class BatchExistsResponse(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ...) -> None: ...

class InventoryItem(_message.Message):
    __slots__ = ("key", "offset", "size_bytes", "checksum", "fingerprint", "parent_key", "tag")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    key: str
    offset: int
    size_bytes: int
    checksum: int
    fingerprint: bytes
    parent_key: str
    tag: bytes
    def __init__(self, key: _Optional[str] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., fingerprint: _Optional[bytes] = ..., parent_key: _Optional[str] = ..., tag: _Optional[bytes] = ...) -> None: ...

class SegmentSpec(_message.Message):
    __slots__ = ("segment_id", "tier", "size_bytes", "inventory")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    tier: str
    size_bytes: int
    inventory: _containers.RepeatedCompositeFieldContainer[InventoryItem]
    def __init__(self, segment_id: _Optional[int] = ..., tier: _Optional[str] = ..., size_bytes: _Optional[int] = ..., inventory: _Optional[_Iterable[_Union[InventoryItem, _Mapping]]] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "incarnation", "endpoint", "shm_socket", "control_endpoint", "secret", "segments", "remount", "generation_seen", "master_run", "nonce")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SHM_SOCKET_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REMOUNT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_SEEN_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: int
    endpoint: str
    shm_socket: str
    control_endpoint: str
    secret: bytes
    segments: _containers.RepeatedCompositeFieldContainer[SegmentSpec]
    remount: bool
    generation_seen: int
    master_run: int
    nonce: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., endpoint: _Optional[str] = ..., shm_socket: _Optional[str] = ..., control_endpoint: _Optional[str] = ..., secret: _Optional[bytes] = ..., segments: _Optional[_Iterable[_Union[SegmentSpec, _Mapping]]] = ..., remount: _Optional[bool] = ..., generation_seen: _Optional[int] = ..., master_run: _Optional[int] = ..., nonce: _Optional[int] = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ("status", "heartbeat_interval_s", "liveness_port", "fences", "fences_signature", "master_run", "master_time_ms", "time_signature", "heartbeat_ttl_s")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_PORT_FIELD_NUMBER: _ClassVar[int]
    FENCES_FIELD_NUMBER: _ClassVar[int]
    FENCES_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TTL_S_FIELD_NUMBER: _ClassVar[int]
    status: Status
    heartbeat_interval_s: float
    liveness_port: int
    fences: _containers.RepeatedCompositeFieldContainer[WriteFence]
    fences_signature: str
    master_run: int
    master_time_ms: int
    time_signature: str
    heartbeat_ttl_s: float
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., heartbeat_interval_s: _Optional[float] = ..., liveness_port: _Optional[int] = ..., fences: _Optional[_Iterable[_Union[WriteFence, _Mapping]]] = ..., fences_signature: _Optional[str] = ..., master_run: _Optional[int] = ..., master_time_ms: _Optional[int] = ..., time_signature: _Optional[str] = ..., heartbeat_ttl_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "incarnation", "nonce")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: int
    nonce: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., nonce: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("status", "master_time_ms", "time_signature")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    master_time_ms: int
    time_signature: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., master_time_ms: _Optional[int] = ..., time_signature: _Optional[str] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "incarnation")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "segment_id", "endpoint", "tier", "size_bytes", "used_bytes", "objects", "last_heartbeat_age_s", "incarnation", "state", "drop_in_s", "leases", "leased_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DROP_IN_S_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_id: int
    endpoint: str
    tier: str
    size_bytes: int
    used_bytes: int
    objects: int
    last_heartbeat_age_s: float
    incarnation: int
    state: str
    drop_in_s: float
    leases: int
    leased_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., segment_id: _Optional[int] = ..., endpoint: _Optional[str] = ..., tier: _Optional[str] = ..., size_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., objects: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ..., incarnation: _Optional[int] = ..., state: _Optional[str] = ..., drop_in_s: _Optional[float] = ..., leases: _Optional[int] = ..., leased_bytes: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("objects", "processing", "bytes_stored", "nodes", "capacity_bytes", "used_bytes", "max_object_bytes", "counters", "leases", "leased_bytes")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    BYTES_STORED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    objects: int
    processing: int
    bytes_stored: int
    nodes: int
    capacity_bytes: int
    used_bytes: int
    max_object_bytes: int
    counters: _containers.ScalarMap[str, int]
    leases: int
    leased_bytes: int
    def __init__(self, objects: _Optional[int] = ..., processing: _Optional[int] = ..., bytes_stored: _Optional[int] = ..., nodes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., max_object_bytes: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., leases: _Optional[int] = ..., leased_bytes: _Optional[int] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("token", "tenant")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    token: str
    tenant: str
    def __init__(self, token: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("status", "role", "tenant", "node_id", "auth")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    status: Status
    role: str
    tenant: str
    node_id: str
    auth: bool
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., role: _Optional[str] = ..., tenant: _Optional[str] = ..., node_id: _Optional[str] = ..., auth: _Optional[bool] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("role", "tenant", "ttl_s", "node_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    tenant: str
    ttl_s: float
    node_id: str
    def __init__(self, role: _Optional[str] = ..., tenant: _Optional[str] = ..., ttl_s: _Optional[float] = ..., node_id: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("status", "token")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    status: Status
    token: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id", "token")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    token: str
    def __init__(self, token_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("status", "already_revoked", "connections_closed", "node_ids_dropped")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_CLOSED_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    already_revoked: bool
    connections_closed: int
    node_ids_dropped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., already_revoked: _Optional[bool] = ..., connections_closed: _Optional[int] = ..., node_ids_dropped: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRevokedTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RevokedToken(_message.Message):
    __slots__ = ("token_id", "expires_s", "revoked_s")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_S_FIELD_NUMBER: _ClassVar[int]
    REVOKED_S_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    expires_s: int
    revoked_s: float
    def __init__(self, token_id: _Optional[str] = ..., expires_s: _Optional[int] = ..., revoked_s: _Optional[float] = ...) -> None: ...

class ListRevokedTokensResponse(_message.Message):
    __slots__ = ("status", "tokens")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    tokens: _containers.RepeatedCompositeFieldContainer[RevokedToken]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., tokens: _Optional[_Iterable[_Union[RevokedToken, _Mapping]]] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("framed_port", "version", "framed_socket", "framed_host", "max_batch_items")
    FRAMED_PORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FRAMED_SOCKET_FIELD_NUMBER: _ClassVar[int]
    FRAMED_HOST_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    framed_port: int
    version: str
    framed_socket: str
    framed_host: str
    max_batch_items: int
    def __init__(self, framed_port: _Optional[int] = ..., version: _Optional[str] = ..., framed_socket: _Optional[str] = ..., framed_host: _Optional[str] = ..., max_batch_items: _Optional[int] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("cursor", "limit", "prefix")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    cursor: str
    limit: int
    prefix: str
    def __init__(self, cursor: _Optional[str] = ..., limit: _Optional[int] = ..., prefix: _Optional[str] = ...) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("key", "size_bytes", "replicas")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    key: str
    size_bytes: int
    replicas: int
    def __init__(self, key: _Optional[str] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys", "next_cursor")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    next_cursor: str
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("node_id", "segment_id", "endpoint", "tier", "offset")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment_id: int
    endpoint: str
    tier: str
    offset: int
    def __init__(self, node_id: _Optional[str] = ..., segment_id: _Optional[int] = ..., endpoint: _Optional[str] = ..., tier: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class DescribeResult(_message.Message):
    __slots__ = ("status", "size_bytes", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    size_bytes: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ...) -> None: ...

class BatchDescribeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DescribeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DescribeResult, _Mapping]]] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("size_bytes", "replicas", "count")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    replicas: int
    count: int
    def __init__(self, size_bytes: _Optional[int] = ..., replicas: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "size_bytes", "replicas", "expires_in_s", "wanted_replicas")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    WANTED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    size_bytes: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaLocation]
    expires_in_s: float
    wanted_replicas: int
    def __init__(self, lease_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaLocation, _Mapping]]] = ..., expires_in_s: _Optional[float] = ..., wanted_replicas: _Optional[int] = ...) -> None: ...

class LeasedPutItem(_message.Message):
    __slots__ = ("spec", "lease_id", "checksum", "failed_segments")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    FAILED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    spec: PutStartItem
    lease_id: str
    checksum: int
    failed_segments: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, spec: _Optional[_Union[PutStartItem, _Mapping]] = ..., lease_id: _Optional[str] = ..., checksum: _Optional[int] = ..., failed_segments: _Optional[_Iterable[int]] = ...) -> None: ...

class BatchLeasedPutRequest(_message.Message):
    __slots__ = ("items", "next", "release")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[LeasedPutItem]
    next: _containers.RepeatedCompositeFieldContainer[LeaseRequest]
    release: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, items: _Optional[_Iterable[_Union[LeasedPutItem, _Mapping]]] = ..., next: _Optional[_Iterable[_Union[LeaseRequest, _Mapping]]] = ..., release: _Optional[_Iterable[str]] = ...) -> None: ...

class LeasedPutResult(_message.Message):
    __slots__ = ("status", "replicas", "already_exists")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    replicas: int
    already_exists: bool
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., replicas: _Optional[int] = ..., already_exists: _Optional[bool] = ...) -> None: ...

class BatchLeasedPutResponse(_message.Message):
    __slots__ = ("results", "leases")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LeasedPutResult]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, results: _Optional[_Iterable[_Union[LeasedPutResult, _Mapping]]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class MoveTask(_message.Message):
    __slots__ = ("key", "src_segment", "src_offset", "dst_segment", "dst_offset", "size_bytes", "checksum", "fingerprint", "parent_key", "tag")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SRC_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DST_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PARENT_KEY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    key: str
    src_segment: int
    src_offset: int
    dst_segment: int
    dst_offset: int
    size_bytes: int
    checksum: int
    fingerprint: bytes
    parent_key: str
    tag: bytes
    def __init__(self, key: _Optional[str] = ..., src_segment: _Optional[int] = ..., src_offset: _Optional[int] = ..., dst_segment: _Optional[int] = ..., dst_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., fingerprint: _Optional[bytes] = ..., parent_key: _Optional[str] = ..., tag: _Optional[bytes] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("tasks", "master_run")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[MoveTask]
    master_run: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[MoveTask, _Mapping]]] = ..., master_run: _Optional[int] = ...) -> None: ...

class MoveResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[Status]
    def __init__(self, statuses: _Optional[_Iterable[_Union[Status, _Mapping]]] = ...) -> None: ...

class FetchTask(_message.Message):
    __slots__ = ("key", "src_endpoint", "grant", "src_offset", "size_bytes", "checksum", "dst_segment", "dst_offset")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SRC_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DST_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    key: str
    src_endpoint: str
    grant: bytes
    src_offset: int
    size_bytes: int
    checksum: int
    dst_segment: int
    dst_offset: int
    def __init__(self, key: _Optional[str] = ..., src_endpoint: _Optional[str] = ..., grant: _Optional[bytes] = ..., src_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., dst_segment: _Optional[int] = ..., dst_offset: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("tasks", "master_run")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[FetchTask]
    master_run: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[FetchTask, _Mapping]]] = ..., master_run: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[Status]
    def __init__(self, statuses: _Optional[_Iterable[_Union[Status, _Mapping]]] = ...) -> None: ...

class ReleasedBlock(_message.Message):
    __slots__ = ("offset", "key", "checksum")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    offset: int
    key: str
    checksum: int
    def __init__(self, offset: _Optional[int] = ..., key: _Optional[str] = ..., checksum: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("segment_id", "offsets", "master_run", "blocks")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    master_run: int
    blocks: _containers.RepeatedCompositeFieldContainer[ReleasedBlock]
    def __init__(self, segment_id: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ..., master_run: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[ReleasedBlock, _Mapping]]] = ...) -> None: ...

class ReplicaRef(_message.Message):
    __slots__ = ("segment_id", "offset")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset: int
    def __init__(self, segment_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CorruptReport(_message.Message):
    __slots__ = ("key", "checksum", "replicas")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    key: str
    checksum: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRef]
    def __init__(self, key: _Optional[str] = ..., checksum: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRef, _Mapping]]] = ...) -> None: ...

class ReportCorruptRequest(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[CorruptReport]
    def __init__(self, reports: _Optional[_Iterable[_Union[CorruptReport, _Mapping]]] = ...) -> None: ...

class VerifyExtent(_message.Message):
    __slots__ = ("segment_id", "offset", "size_bytes", "checksum")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset: int
    size_bytes: int
    checksum: int
    def __init__(self, segment_id: _Optional[int] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("extents",)
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    extents: _containers.RepeatedCompositeFieldContainer[VerifyExtent]
    def __init__(self, extents: _Optional[_Iterable[_Union[VerifyExtent, _Mapping]]] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[Status]
    def __init__(self, statuses: _Optional[_Iterable[_Union[Status, _Mapping]]] = ...) -> None: ...

class WriteFence(_message.Message):
    __slots__ = ("segment_id", "floor", "open")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FLOOR_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    floor: int
    open: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, segment_id: _Optional[int] = ..., floor: _Optional[int] = ..., open: _Optional[_Iterable[int]] = ...) -> None: ...

class FenceWritesRequest(_message.Message):
    __slots__ = ("fences", "master_run")
    FENCES_FIELD_NUMBER: _ClassVar[int]
    MASTER_RUN_FIELD_NUMBER: _ClassVar[int]
    fences: _containers.RepeatedCompositeFieldContainer[WriteFence]
    master_run: int
    def __init__(self, fences: _Optional[_Iterable[_Union[WriteFence, _Mapping]]] = ..., master_run: _Optional[int] = ...) -> None: ...

class WriteChunk(_message.Message):
    __slots__ = ("grant", "offset", "size_bytes", "data")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    grant: bytes
    offset: int
    size_bytes: int
    data: bytes
    def __init__(self, grant: _Optional[bytes] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WriteResult(_message.Message):
    __slots__ = ("status", "checksum", "checksum_str")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_STR_FIELD_NUMBER: _ClassVar[int]
    status: Status
    checksum: int
    checksum_str: str
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., checksum: _Optional[int] = ..., checksum_str: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("grant", "offset", "size_bytes", "checksum", "checksum_str")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_STR_FIELD_NUMBER: _ClassVar[int]
    grant: bytes
    offset: int
    size_bytes: int
    checksum: int
    checksum_str: str
    def __init__(self, grant: _Optional[bytes] = ..., offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., checksum_str: _Optional[str] = ...) -> None: ...

class ReadChunk(_message.Message):
    __slots__ = ("status", "data")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    status: Status
    data: bytes
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id", "incarnation")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    incarnation: int
    def __init__(self, node_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("status", "remaining", "copying", "saved")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    COPYING_FIELD_NUMBER: _ClassVar[int]
    SAVED_FIELD_NUMBER: _ClassVar[int]
    status: Status
    remaining: int
    copying: int
    saved: int
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., remaining: _Optional[int] = ..., copying: _Optional[int] = ..., saved: _Optional[int] = ...) -> None: ...
