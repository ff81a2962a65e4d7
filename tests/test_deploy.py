"""The deployable stack, offline: `make package` (infra/package.py) builds a template cfn-lint accepts, with the
production settings the design relies on; and what the deployed functions read at start-up (the signing key and
AUTH secrets, cluster mode) works, with Secrets Manager played by moto."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path

import boto3
import pytest
import redis
from moto import mock_aws

from chalicelib import aws, queue, runtime
from chalicelib.config import ORIGIN_TIMEOUT_MAX_MS, ConfigError, Keyring, load_keyring, load_settings
from chalicelib.observability import Tally, count
from chalicelib.pump import Pump
from chalicelib.redis_connection import connect
from chalicelib.target_config import parse_config
from chalicelib.targets import TARGET_TYPES, Target
from infra.package import deep_merge, merge_template

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ("APIHandler", "PurchaseAuthorizer", "AdmissionPump", "FlagSync")
ROLES = {
    "APIHandler": "ApiHandlerRole",
    "PurchaseAuthorizer": "PurchaseAuthorizerRole",
    "AdmissionPump": "AdmissionPumpRole",
    "FlagSync": "FlagSyncRole",
}
PURCHASE_PATHS = {kind.purchase_path for kind in TARGET_TYPES.values()}
DROP = Target("limited-drop", 42)


@pytest.fixture(scope="module")
def openapi(resources):
    return resources["RestAPI"]["Properties"]["DefinitionBody"]


def of_type(resources, kind):
    return {name: r for name, r in resources.items() if r["Type"] == kind}


def env_of(resources, function):
    return resources[function]["Properties"]["Environment"]["Variables"]


# --- the template as a whole ---


@pytest.mark.slow
def test_template_passes_cfn_lint(deployment):
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), "--", str(deployment / "sam.json")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pieces_merge_mappings_and_refuse_to_overwrite_each_other():
    merged = deep_merge({"R": {"P": {"Env": {"A": "1"}}}}, {"R": {"P": {"Env": {"B": "2"}, "List": [1]}}})
    assert merged == {"R": {"P": {"Env": {"A": "1", "B": "2"}, "List": [1]}}}
    assert deep_merge(merged, {"R": {"P": {"List": [1]}}}) == merged  # the same value twice is no conflict
    with pytest.raises(ValueError, match="R.P.Env.A"):
        deep_merge(merged, {"R": {"P": {"Env": {"A": "3"}}}})
    with pytest.raises(ValueError, match="R.P.List"):
        deep_merge(merged, {"R": {"P": {"List": [2]}}})


def test_pieces_sharing_a_mapping_through_a_yaml_anchor_stay_apart():
    shared = {"X": "1"}
    merged = deep_merge({}, {"A": {"Env": shared}, "B": {"Env": shared}})
    deep_merge(merged, {"A": {"Env": {"Y": "2"}}})
    assert merged["B"]["Env"] == {"X": "1"}


def test_merge_template_hosts_infra_flags_json_as_the_flag_default():
    content = merge_template()["Resources"]["FlagDefault"]["Properties"]["Content"]
    assert json.loads(content) == json.loads((ROOT / "infra" / "flags.json").read_text())


@pytest.mark.slow
def test_template_names_no_region_of_its_own(deployment):
    template = json.loads((deployment / "sam.json").read_text())
    # Where CloudFront keeps what is global: the edge's certificates and its metrics, in us-east-1 only.
    assert ":acm:us-east-1:" in template["Parameters"].pop("EdgeCertificateArn")["AllowedPattern"]
    assert "us-east-1" in json.dumps(template["Rules"].pop("EdgeDomainNeedsItsCertificate"))
    body = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    edge = '"title": "Edge (CloudFront, ${EdgeDistributionId}): requests and error rates", "region": "us-east-1"'
    assert edge in body[0]
    body[0] = body[0].replace(edge, "")
    assert "us-east-1" not in json.dumps(template)  # the region Chalice was started with


# --- API Gateway ---


@pytest.mark.slow
def test_purchase_routes_are_behind_the_request_authorizer(resources, openapi):
    entry = openapi["securityDefinitions"]["purchase_authorizer"]["x-amazon-apigateway-authorizer"]
    assert entry["type"] == "request"
    # Together: no identity source, so a purchase without a token reaches the function (which lets it through
    # while the queue is off, and counts its denial while on); that is allowed only with caching off.
    assert "identitySource" not in entry and entry["authorizerResultTtlInSeconds"] == 0
    assert {"Ref": "PurchaseAuthorizer.Alias"} in entry["authorizerUri"]["Fn::Join"][1]
    guarded = {
        path
        for path, methods in openapi["paths"].items()
        for method in methods.values()
        if {"purchase_authorizer": []} in method.get("security", [])
    }
    assert guarded == PURCHASE_PATHS
    assert all(list(openapi["paths"][path]) == ["post"] for path in PURCHASE_PATHS)

    permission = resources["PurchaseAuthorizerInvokePermission"]["Properties"]
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["FunctionName"] == {"Ref": "PurchaseAuthorizer.Alias"}
    assert permission["SourceArn"]["Fn::Sub"].endswith("${RestAPI}/authorizers/*")


@pytest.mark.slow
def test_no_placeholder_is_left_in_the_template(deployment):
    assert "set-by-infra" not in (deployment / "sam.json").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, status, code, headers",
    [
        ("ACCESS_DENIED", 403, "QUEUE_BYPASS_DENIED", {}),
        ("UNAUTHORIZED", 401, "UNAUTHENTICATED", {"WWW-Authenticate": "'Bearer realm=\"virtual-queue\"'"}),
        ("AUTHORIZER_FAILURE", 503, "QUEUE_UNAVAILABLE", {"Retry-After": "'2'"}),
    ],
)
def test_the_authorizer_s_answers_are_the_contract_s(openapi, kind, status, code, headers):
    """A Deny is 403; its failure (jwt mode: the provider's keys cannot be had) 503 with Retry-After; an
    "Unauthorized", which it never sends (the route answers a missing JWT's 401), would be the route's 401."""
    response = openapi["x-amazon-apigateway-gateway-responses"][kind]
    assert response["statusCode"] == status
    # API Gateway fills in $context.error.messageString as a quoted JSON string.
    body = response["responseTemplates"]["application/json"].replace("$context.error.messageString", '"Unauthorized"')
    assert json.loads(body)["code"] == code
    assert (
        response["responseParameters"].items() >= {f"gatewayresponse.header.{k}": v for k, v in headers.items()}.items()
    )


@pytest.mark.slow
def test_the_deployed_default_is_jwt_with_the_provider_s_settings(template, resources):
    assert template["Parameters"]["IdentityMode"]["Default"] == "jwt"
    for function in ("APIHandler", "PurchaseAuthorizer"):
        env = env_of(resources, function)
        assert env["VQ_IDENTITY"] == {"Ref": "IdentityMode"}
        for variable, parameter in (
            ("VQ_JWT_ISSUER", "JwtIssuer"),
            ("VQ_JWT_AUDIENCE", "JwtAudience"),
            ("VQ_JWKS_URL", "JwksUrl"),
            ("VQ_JWT_USER_CLAIM", "JwtUserClaim"),
        ):
            assert env[variable] == {"Ref": parameter}
    assert env_of(resources, "APIHandler")["VQ_LOGIN_URL"] == {"Ref": "LoginUrl"}
    # jwt without its provider is refused before anything is created.
    assertions = template["Rules"]["JwtIdentityNeedsItsProvider"]["Assertions"]
    assert {a["Assert"]["Fn::Not"][0]["Fn::Equals"][0]["Ref"] for a in assertions} == {
        "JwtIssuer",
        "JwtAudience",
        "JwksUrl",
    }


@pytest.mark.slow
def test_operator_routes_need_iam_and_client_routes_nothing(openapi):
    for path, methods in openapi["paths"].items():
        for method, spec in methods.items():
            if path.endswith(("/stats", "/config")) or path in ("/virtual-queues", "/console"):
                assert spec.get("security") == [{"sigv4": []}], (path, method)
            elif path not in PURCHASE_PATHS:
                assert "security" not in spec, (path, method)
    assert "/virtual-queues/{queue_type}/{target_id}/stats" in openapi["paths"]
    assert "/console" in openapi["paths"]


OPERATOR_ROUTES = {
    ("GET", "/virtual-queues"),
    ("GET", "/virtual-queues/{queue_type}/{target_id}/stats"),
    ("GET", "/virtual-queues/{queue_type}/{target_id}/config"),
    ("PUT", "/virtual-queues/{queue_type}/{target_id}/config"),
    ("PATCH", "/virtual-queues/{queue_type}/{target_id}/config"),
    ("GET", "/console"),
}


def as_arn_path(method, path):
    return f"{method}{re.sub(r'{[^}]+}', '*', path)}"


@pytest.mark.slow
def test_the_operator_role_may_call_the_operator_routes_only_and_only_it_may(template, resources, openapi):
    iam_routes = {
        (method.upper(), path)
        for path, methods in openapi["paths"].items()
        for method, spec in methods.items()
        if spec.get("security") == [{"sigv4": []}]
    }
    assert iam_routes <= OPERATOR_ROUTES  # PATCH arrives with the operator CLI; the role already names it
    (statement,) = resources["OperatorRoutesPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert resources["OperatorRoutesPolicy"]["Properties"]["Roles"] == [{"Ref": "OperatorRole"}]
    assert statement["Action"] == "execute-api:Invoke"
    stage = resources["RestAPI"]["Properties"]["StageName"]
    head = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${RestAPI}/" + stage + "/"
    assert {r["Fn::Sub"] for r in statement["Resource"]} == {head + as_arn_path(*r) for r in OPERATOR_ROUTES}
    assert "Policies" not in resources["OperatorRole"]["Properties"]  # nothing else

    # The API's resource policy: everyone may call the API, nobody but the role the operator routes.
    allow, deny = openapi["x-amazon-apigateway-policy"]["Statement"]
    assert (allow["Effect"], allow["Principal"], allow["Resource"]) == ("Allow", "*", "execute-api:/*")
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*"
    assert deny["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": {"Fn::GetAtt": ["OperatorRole", "Arn"]}}}
    denied = [
        re.compile(re.escape(r.removeprefix("execute-api:/*/")).replace(r"\*", "[^/]+")) for r in deny["Resource"]
    ]
    for method, path in OPERATOR_ROUTES:
        assert any(p.fullmatch(as_arn_path(method, path).replace("*", "x")) for p in denied), (method, path)
    for path, methods in openapi["paths"].items():
        for method in methods:
            if (method.upper(), path) not in OPERATOR_ROUTES:
                arn_path = as_arn_path(method.upper(), path).replace("*", "x")
                assert not any(p.fullmatch(arn_path) for p in denied), (method, path)
    assert template["Outputs"]["OperatorRoleArn"]["Value"] == {"Fn::GetAtt": ["OperatorRole", "Arn"]}


# --- network, cache, secrets, flag ---


def test_the_deploy_guide_names_an_endpoint_for_every_service_the_functions_call():
    guide = (ROOT / "docs" / "deploy.md").read_text()
    services = typing.get_args(aws.Service)
    assert set(services) == {"secretsmanager", "appconfigdata", "events"}
    for service in services:  # an interface endpoint each, where there is no NAT gateway
        assert f"`com.amazonaws.<region>.{service}`" in guide
    assert "private DNS enabled" in guide and "TCP 443 from the functions' security group" in guide


@pytest.mark.slow
def test_every_function_runs_in_the_vpc(resources):
    assert set(of_type(resources, "AWS::Serverless::Function")) == set(FUNCTIONS)
    for function in FUNCTIONS:
        properties = resources[function]["Properties"]
        assert properties["VpcConfig"] == {
            "SubnetIds": {"Ref": "SubnetIds"},
            "SecurityGroupIds": [{"Ref": "LambdaSecurityGroupId"}],
        }
        assert properties["Role"] == {"Fn::GetAtt": [ROLES[function], "Arn"]}
        (network,) = resources[ROLES[function]]["Properties"]["Policies"]
        actions = {a for s in network["PolicyDocument"]["Statement"] for a in s["Action"]}
        assert actions == {
            "ec2:CreateNetworkInterface",
            "ec2:DescribeNetworkInterfaces",
            "ec2:DescribeSubnets",
            "ec2:DeleteNetworkInterface",
            "ec2:AssignPrivateIpAddresses",
            "ec2:UnassignPrivateIpAddresses",
        }


@pytest.mark.slow
def test_cache_is_valkey_cluster_mode_encrypted_multi_az_and_never_evicts(template, resources):
    group = resources["ReplicationGroup"]["Properties"]
    # Patched and failed over by ElastiCache only in the window the operator chose (docs/deploy.md).
    assert group["PreferredMaintenanceWindow"] == {"Ref": "CacheMaintenanceWindow"}
    window = template["Parameters"]["CacheMaintenanceWindow"]
    assert re.fullmatch(window["AllowedPattern"], window["Default"]) and window["Default"].startswith("tue:08")
    assert not re.fullmatch(window["AllowedPattern"], "tue:25:00-tue:26:00")
    assert group["Engine"] == "valkey" and group["ClusterMode"] == "enabled"
    assert group["TransitEncryptionEnabled"] is True and group["AtRestEncryptionEnabled"] is True
    assert group["MultiAZEnabled"] is True and group["AutomaticFailoverEnabled"] is True
    assert group["NumNodeGroups"] == {"Ref": "CacheShards"}
    assert group["ReplicasPerNodeGroup"] == {"Ref": "CacheReplicasPerShard"}
    assert template["Parameters"]["CacheReplicasPerShard"]["MinValue"] >= 1
    assert group["AuthToken"] == {"Fn::Sub": "{{resolve:secretsmanager:${RedisAuthToken}}}"}
    assert group["CacheParameterGroupName"] == {"Ref": "CacheParameterGroup"}
    assert group["CacheSubnetGroupName"] == {"Ref": "CacheSubnetGroup"}

    parameters_ = resources["CacheParameterGroup"]["Properties"]
    assert parameters_["Properties"] == {"cluster-enabled": "yes", "maxmemory-policy": "noeviction"}
    assert parameters_["CacheParameterGroupFamily"].startswith("valkey")
    assert resources["CacheSubnetGroup"]["Properties"]["SubnetIds"] == {"Ref": "SubnetIds"}
    assert group["SecurityGroupIds"] == [{"Fn::GetAtt": ["CacheSecurityGroup", "GroupId"]}]
    ingress = resources["CacheSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert [(rule["FromPort"], rule["ToPort"], rule["SourceSecurityGroupId"]) for rule in ingress] == [
        (6379, 6379, {"Ref": "LambdaSecurityGroupId"})
    ]


@pytest.mark.slow
def test_the_serverless_cache_is_an_option_with_the_same_token_and_no_storage_cap(template, resources):
    assert template["Parameters"]["CacheMode"]["Default"] == "nodes"
    assert template["Parameters"]["CacheMode"]["AllowedValues"] == ["nodes", "serverless"]
    for name in ("ReplicationGroup", "CacheParameterGroup", "CacheSubnetGroup"):
        assert resources[name]["Condition"] == "CacheOnNodes"
    for name in ("ServerlessCache", "CacheUserGroup", "CacheUser"):
        assert resources[name]["Condition"] == "CacheServerless"
    cache = resources["ServerlessCache"]["Properties"]
    assert cache["Engine"] == "valkey" and cache["UserGroupId"] == {"Ref": "CacheUserGroup"}
    assert cache["SecurityGroupIds"] == [{"Fn::GetAtt": ["CacheSecurityGroup", "GroupId"]}]
    # Only a minimum of ECPUs, when asked: a storage maximum would make it evict keys with a TTL (every queue key).
    assert cache["CacheUsageLimits"]["Fn::If"][1] == {
        "ECPUPerSecond": {"Minimum": {"Ref": "CacheServerlessMinEcpuPerSecond"}}
    }
    user = resources["CacheUser"]["Properties"]
    assert user["UserName"] == "default" and user["AccessString"] == "on ~* +@all"  # AUTH <token> logs in as it
    assert user["AuthenticationMode"] == {
        "Type": "password",
        "Passwords": [{"Fn::Sub": "{{resolve:secretsmanager:${RedisAuthToken}}}"}],
    }
    assert resources["CacheUserGroup"]["Properties"]["UserIds"] == [{"Ref": "CacheUser"}]


@pytest.mark.slow
def test_functions_find_redis_and_secrets_but_never_hold_one(template, resources):
    for function in ("APIHandler", "AdmissionPump", "FlagSync"):
        env = env_of(resources, function)
        condition, nodes, serverless = env["REDIS_URL"]["Fn::If"]
        assert condition == "CacheOnNodes"
        assert nodes["Fn::Sub"].startswith("rediss://${ReplicationGroup.ConfigurationEndPoint.Address}:")
        assert serverless["Fn::Sub"].startswith("rediss://${ServerlessCache.Endpoint.Address}:")
        assert "@" not in json.dumps(env["REDIS_URL"])  # no password in the URL: it comes from the secret
        assert env["VQ_REDIS_CLUSTER"] == "true"
        assert env["VQ_REDIS_AUTH_SECRET_ID"] == {"Ref": "RedisAuthToken"}
    assert "REDIS_URL" not in env_of(resources, "PurchaseAuthorizer")  # the authorizer needs no Redis
    for function in ("APIHandler", "PurchaseAuthorizer"):
        assert env_of(resources, function)["VQ_TOKEN_KEYS_SECRET_ID"] == {"Ref": "SigningKeys"}
    for function in FUNCTIONS:
        assert "VQ_TOKEN_KEYS" not in env_of(resources, function)
    assert env_of(resources, "APIHandler")["VQ_FAIL_MODE"] == {"Ref": "FailMode"}
    assert env_of(resources, "APIHandler")["VQ_ORIGIN_LIMITED_DROP_URL"] == {"Ref": "OriginLimitedDropUrl"}
    assert env_of(resources, "APIHandler")["VQ_ORIGIN_TICKETING_URL"] == {"Ref": "OriginTicketingUrl"}
    assert env_of(resources, "APIHandler")["VQ_IDEMPOTENCY_KEY_FORMAT"] == {"Ref": "IdempotencyKeyFormat"}
    assert template["Parameters"]["IdempotencyKeyFormat"]["AllowedValues"] == ["string", "bare"]
    # Deployed, a target exists only once an operator opened it.
    assert env_of(resources, "APIHandler")["VQ_TARGETS_OPEN_ON_FIRST_USE"] == "false"


@pytest.mark.slow
def test_each_function_may_read_only_what_it_needs(resources):
    readable = {role: set() for role in ROLES.values()}
    for policy in of_type(resources, "AWS::IAM::Policy").values():
        properties = policy["Properties"]
        if properties["PolicyName"] in ("write-own-logs", "publish-events", "call-operator-routes"):
            # tests/test_stack_hygiene.py; test_only_the_pump_may_publish_events_to_its_bus_only;
            # test_the_operator_role_may_call_the_operator_routes_only_and_only_it_may
            continue
        for statement in properties["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow" and "*" not in json.dumps(statement["Action"])
            resource = statement["Resource"]
            name = resource.get("Ref", "flag")
            if name == "flag":
                assert "configuration/${FlagProfile}" in resource["Fn::Sub"]
            for role in properties["Roles"]:
                readable[role["Ref"]].add(name)
    assert readable == {
        "ApiHandlerRole": {"RedisAuthToken", "SigningKeys", "flag"},
        "PurchaseAuthorizerRole": {"SigningKeys", "flag"},
        "AdmissionPumpRole": {"RedisAuthToken"},  # the pump signs nothing
        "FlagSyncRole": {"RedisAuthToken", "flag"},
    }
    for role in ROLES.values():  # beyond these, the roles allow network interfaces only (test above)
        for policy in resources[role]["Properties"]["Policies"]:
            assert policy["PolicyName"] == "vpc-network-interfaces"


@pytest.mark.slow
def test_signing_keys_are_generated_in_the_flat_shape_the_keyring_reads(resources):
    generated = resources["SigningKeys"]["Properties"]["GenerateSecretString"]
    template = json.loads(generated["SecretStringTemplate"])
    assert template == {"activeKid": "k1"} and generated["GenerateStringKey"] == "k1"
    secret = json.dumps({**template, generated["GenerateStringKey"]: "g" * generated["PasswordLength"]})
    assert Keyring.from_secret(secret).active_kid == "k1"


@pytest.mark.slow
def test_flag_is_hosted_in_appconfig_deployed_at_once_and_read_by_api_and_authorizer(resources):
    assert resources["FlagProfile"]["Properties"]["Type"] == "AWS.Freeform"
    strategy = resources["FlagImmediate"]["Properties"]
    assert (strategy["DeploymentDurationInMinutes"], strategy["FinalBakeTimeInMinutes"], strategy["GrowthFactor"]) == (
        0,
        0,
        100,
    )
    deployment = resources["FlagDeployment"]["Properties"]
    assert deployment["ConfigurationVersion"] == {"Ref": "FlagDefault"}
    assert deployment["DeploymentStrategyId"] == {"Ref": "FlagImmediate"}
    for function in ("APIHandler", "PurchaseAuthorizer"):
        env = env_of(resources, function)
        assert (env["VQ_APPCONFIG_APPLICATION"], env["VQ_APPCONFIG_ENVIRONMENT"], env["VQ_APPCONFIG_PROFILE"]) == (
            {"Ref": "FlagApplication"},
            {"Ref": "FlagEnvironment"},
            {"Ref": "FlagProfile"},
        )
    assert "VQ_APPCONFIG_APPLICATION" not in env_of(resources, "AdmissionPump")


@pytest.mark.slow
def test_every_flag_deployment_runs_flag_sync_which_never_signs(resources):
    extension = resources["FlagSyncExtension"]["Properties"]["Actions"]
    assert set(extension) == {"PRE_START_DEPLOYMENT", "ON_DEPLOYMENT_ROLLED_BACK"}
    for (action,) in extension.values():
        assert action["Uri"] == {"Ref": "FlagSync.Alias"}
        assert action["RoleArn"] == {"Fn::GetAtt": ["FlagSyncInvokeRole", "Arn"]}
    association = resources["FlagSyncExtensionAssociation"]["Properties"]
    assert association["ExtensionIdentifier"] == {"Fn::GetAtt": ["FlagSyncExtension", "Arn"]}
    assert association["ResourceIdentifier"]["Fn::Sub"].endswith("configurationprofile/${FlagProfile}")
    invoke = resources["FlagSyncInvokeRole"]["Properties"]
    (trust,) = invoke["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "appconfig.amazonaws.com"}
    # Only AppConfig acting for this account (never another account's extension naming this role).
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    (statement,) = invoke["Policies"][0]["PolicyDocument"]["Statement"]
    assert (statement["Action"], statement["Resource"]) == ("lambda:InvokeFunction", {"Ref": "FlagSync.Alias"})
    env = env_of(resources, "FlagSync")
    assert env["VQ_SIGNS_TOKENS"] == "false" and env["VQ_APPCONFIG_PROFILE"] == {"Ref": "FlagProfile"}


# --- the pump ---


@pytest.mark.slow
def test_pump_runs_every_minute_and_is_never_retried(resources):
    invoke = resources["AdmissionPumpInvokeConfig"]
    assert invoke["Properties"]["FunctionName"] == {"Ref": "AdmissionPump"}
    assert invoke["Properties"]["Qualifier"] == "live" and invoke["DependsOn"] == ["AdmissionPumpAliaslive"]
    assert invoke["Properties"]["MaximumRetryAttempts"] == 0 and invoke["Properties"]["MaximumEventAgeInSeconds"] <= 60
    rule = resources["AdmissionPumpSchedule"]["Properties"]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    assert rule["Targets"][0]["Arn"] == {"Ref": "AdmissionPump.Alias"}
    assert of_type(resources, "AWS::Lambda::EventInvokeConfig").keys() == {"AdmissionPumpInvokeConfig"}


# --- capacity ---


@pytest.mark.slow
def test_functions_memory_is_a_parameter_with_a_default_past_lambdas_128_mb(template, resources):
    memory = template["Parameters"]["FunctionMemoryMb"]
    assert memory["Default"] == 1024 and memory["MinValue"] == 128
    for function in FUNCTIONS:
        assert resources[function]["Properties"]["MemorySize"] == {"Ref": "FunctionMemoryMb"}


# Lambda's default concurrency quota per region, and what it keeps unreserved for the functions without a
# reservation (the Lambda developer guide, "Lambda function scaling" and "Configuring reserved concurrency").
ACCOUNT_QUOTA, UNRESERVED_MINIMUM = 1000, 100
RESERVATIONS = {
    "APIHandler": ("ApiCapped", "ApiMaxConcurrency"),
    "PurchaseAuthorizer": ("AuthorizerReserved", "AuthorizerReservedConcurrency"),
    "AdmissionPump": ("PumpReserved", "PumpReservedConcurrency"),
}


@pytest.mark.slow
def test_the_api_is_capped_and_the_authorizer_and_pump_reserved_leaving_the_account_its_unreserved_minimum(
    template, resources
):
    defaults = {parameter: template["Parameters"][parameter]["Default"] for _, parameter in RESERVATIONS.values()}
    for function, (condition, parameter) in RESERVATIONS.items():
        # 0 takes a reservation away, for an account whose quota cannot hold them (docs/deploy.md: concurrency).
        assert template["Conditions"][condition] == {"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, 0]}]}
        assert resources[function]["Properties"]["ReservedConcurrentExecutions"] == {
            "Fn::If": [condition, {"Ref": parameter}, {"Ref": "AWS::NoValue"}]
        }
        assert defaults[parameter] > 0 and template["Parameters"][parameter]["MinValue"] == 0
    # Lambda refuses a reservation that would leave fewer than 100 executions unreserved: the defaults deploy on an
    # account with the default quota, with room for flag_sync and the account's other functions.
    assert sum(defaults.values()) <= ACCOUNT_QUOTA - UNRESERVED_MINIMUM
    # The cap holds what the origin asks with the edge in front (docs/deploy.md: concurrency): its busiest warm
    # second (arrivals at their throttle, ~11 polls per admission near the front, a purchase per admission, each
    # 15 ms of a function: infra/sim/pacing_model.py's HANDLER_S) ten times over, and an opening's first second on
    # cold containers (each arrival holding its execution for a start of about a quarter second).
    p = {name: spec.get("Default") for name, spec in template["Parameters"].items()}
    admissions_per_s = p["BatchSize"] / (p["TickMs"] / 1000)
    busiest_per_s = p["ArrivalThrottleRate"] + 11 * admissions_per_s + admissions_per_s
    assert 10 * busiest_per_s * 0.015 <= p["ApiMaxConcurrency"]
    assert p["ArrivalThrottleRate"] * 0.25 <= p["ApiMaxConcurrency"]
    # The authorizer answers a purchase a second per admission, each up to a second on a cold container.
    assert admissions_per_s * 1.0 <= p["AuthorizerReservedConcurrency"]
    # flag_sync has none (tests/test_stack_hygiene.py accepts it), and Chalice's own setting is never used.
    assert "ReservedConcurrentExecutions" not in resources["FlagSync"]["Properties"]
    assert "reserved_concurrency" not in json.dumps(json.loads((ROOT / ".chalice" / "config.json").read_text()))


@pytest.mark.slow
def test_the_api_function_ends_before_api_gateway_gives_up_and_every_outbound_budget_fits_inside(resources):
    # API Gateway's integration timeout is 29 s (the REGIONAL API keeps the default) and CloudFront waits 30 s for
    # it: a longer function only leaves zombie invocations. The worst request (docs/deploy.md: timeouts) reads both
    # secrets on a cold start, makes its Redis calls and waits for the shop.
    timeout = resources["APIHandler"]["Properties"]["Timeout"]
    config = aws.CLIENT_CONFIG
    secret_read_s = (config.connect_timeout + config.read_timeout) * config.retries["total_max_attempts"]
    redis_call_s = 0.2 + 0.5  # connect() in chalicelib/redis_connection.py
    worst_s = 2 * secret_read_s + 4 * redis_call_s + ORIGIN_TIMEOUT_MAX_MS / 1000
    assert worst_s < timeout < 29
    origin = resources["Distribution"]["Properties"]["DistributionConfig"]["Origins"][0]
    assert origin["CustomOriginConfig"]["OriginReadTimeout"] > 29
    assert resources["PurchaseAuthorizer"]["Properties"]["Timeout"] > secret_read_s + 1


@pytest.mark.slow
def test_api_gateway_calls_the_alias_that_optional_provisioned_concurrency_is_on(template, resources, openapi):
    assert template["Parameters"]["ApiProvisionedConcurrency"]["Default"] == 0
    api = resources["APIHandler"]["Properties"]
    assert api["AutoPublishAlias"] == "live"
    assert api["ProvisionedConcurrencyConfig"] == {
        "Fn::If": [
            "ApiProvisioned",
            {"ProvisionedConcurrentExecutions": {"Ref": "ApiProvisionedConcurrency"}},
            {"Ref": "AWS::NoValue"},
        ]
    }
    integrations = [
        op["x-amazon-apigateway-integration"]
        for ops in openapi["paths"].values()
        for op in ops.values()
        if isinstance(op, dict) and "x-amazon-apigateway-integration" in op
    ]
    assert len(integrations) >= 8
    for integration in integrations:
        assert {"Ref": "APIHandler.Alias"} in integration["uri"]["Fn::Join"][1], integration["uri"]
        assert "APIHandler.Arn" not in json.dumps(integration)
    assert resources["APIHandlerInvokePermission"]["Properties"]["FunctionName"] == {"Ref": "APIHandler.Alias"}


@pytest.mark.slow
def test_every_function_runs_a_published_version_through_its_alias(resources, openapi):
    for function in FUNCTIONS:
        assert resources[function]["Properties"]["AutoPublishAlias"] == "live"
    # Whoever starts a function starts its alias, never the unpublished $LATEST.
    entry = openapi["securityDefinitions"]["purchase_authorizer"]["x-amazon-apigateway-authorizer"]
    assert {"Ref": "PurchaseAuthorizer.Alias"} in entry["authorizerUri"]["Fn::Join"][1]
    for permission, function in (
        ("APIHandlerInvokePermission", "APIHandler"),
        ("PurchaseAuthorizerInvokePermission", "PurchaseAuthorizer"),
        ("AdmissionPumpSchedulePermission", "AdmissionPump"),
    ):
        assert resources[permission]["Properties"]["FunctionName"] == {"Ref": f"{function}.Alias"}
    invokers = json.dumps({name: r for name, r in resources.items() if r["Type"] != "AWS::CloudWatch::Alarm"})
    for function in FUNCTIONS:
        assert f'["{function}", "Arn"]' not in invokers and "${" + function + ".Arn}" not in invokers


@pytest.mark.slow
def test_a_release_reaches_the_api_and_the_authorizer_as_a_canary_their_alarms_roll_back(template, resources):
    strategy = template["Parameters"]["ReleaseStrategy"]
    assert strategy["Default"] == "Canary10Percent5Minutes" and "AllAtOnce" in strategy["AllowedValues"]
    rollback = {
        "APIHandler": ["ApiErrorRateAlarm", "ApiLatencyAlarm", "ApiFunctionErrorsAlarm"],
        "PurchaseAuthorizer": ["AuthorizerErrorsAlarm"],
    }
    for function, alarms in rollback.items():
        preference = resources[function]["Properties"]["DeploymentPreference"]
        assert preference == {"Type": {"Ref": "ReleaseStrategy"}, "Alarms": [{"Ref": alarm} for alarm in alarms]}
        for alarm in alarms:  # alarms every stack has
            assert resources[alarm]["Type"] == "AWS::CloudWatch::Alarm" and "Condition" not in resources[alarm]
    for function in ("AdmissionPump", "FlagSync"):  # one invocation at a time: nothing to split
        assert "DeploymentPreference" not in resources[function]["Properties"]


STACK_POLICY = ROOT / "infra" / "stack-policy.json"
THE_CACHE = {
    "ReplicationGroup",
    "ServerlessCache",
    "CacheUser",
    "CacheUserGroup",
    "CacheParameterGroup",
    "CacheSubnetGroup",
    "CacheSecurityGroup",
    "RedisAuthToken",
}


@pytest.mark.slow
def test_the_cache_outlives_a_replacement_or_its_stack_and_the_stack_policy_refuses_both(resources):
    for name in THE_CACHE:
        assert resources[name]["DeletionPolicy"] == resources[name]["UpdateReplacePolicy"] == "Retain", name
    allow, deny = json.loads(STACK_POLICY.read_text())["Statement"]
    assert allow == {"Effect": "Allow", "Principal": "*", "Action": "Update:*", "Resource": "*"}
    assert (deny["Effect"], deny["Principal"], set(deny["Action"])) == (
        "Deny",
        "*",
        {"Update:Replace", "Update:Delete"},
    )
    protected = {resource.removeprefix("LogicalResourceId/") for resource in deny["Resource"]}
    # The cache, and the signing keys: replaced, every ticket and entry token in the hands of shoppers is void.
    assert protected == THE_CACHE | {"SigningKeys"} and protected <= set(resources)
    # The deploy command applies it, every time (docs/deploy.md: build and deploy).
    guide = (ROOT / "docs" / "deploy.md").read_text()
    deploy = guide[guide.index("## Build and deploy") : guide.index("## Parameters")]
    assert (
        "aws cloudformation set-stack-policy --stack-name virtual-queue --stack-policy-body file://infra/stack-policy.json"
        in deploy
    )
    assert "--enable-termination-protection" in deploy


# --- alarms and dashboard ---


def emitted_names():
    """Every metric name the code emits, read from its source."""
    source = "\n".join(path.read_text() for path in [ROOT / "app.py", *(ROOT / "chalicelib").glob("*.py")])
    return (
        set(re.findall(r'count\(\s*"(\w+)"', source))
        | set(re.findall(r'add_metric\(\s*name="(\w+)"', source))
        | set(re.findall(r'Tally\(\s*"(\w+)"', source))
    )


# What AWS files and the alarms read, per namespace: the Lambda developer guide ("Types of metrics for Lambda
# functions", its account-wide ConcurrentExecutions and Throttles too), API Gateway's ("Amazon API Gateway
# dimensions and metrics"), ElastiCache's ("Host-level metrics", "Metrics for Valkey and Redis OSS", "Serverless
# metrics"), AWS WAF's ("AWS WAF metrics and dimensions") and CloudFront's ("CloudFront distribution metrics").
AWS_METRICS = {
    "AWS/Lambda": {"Errors", "Throttles", "Invocations", "AsyncEventsDropped", "Duration", "ConcurrentExecutions"},
    "AWS/ApiGateway": {"Count", "5XXError", "4XXError", "Latency", "IntegrationLatency"},
    "AWS/ElastiCache": {
        "DatabaseMemoryUsagePercentage",
        "EngineCPUUtilization",
        "ReplicationLag",
        "BytesUsedForCache",
        "ElastiCacheProcessingUnits",
        "ThrottledCmds",
    },
    "AWS/WAFV2": {"BlockedRequests"},
    "AWS/CloudFront": {"Requests", "4xxErrorRate", "5xxErrorRate"},
}


def filed_from_logs(resources):
    """The metrics the log groups' metric filters file (infra/logs.yaml), by name."""
    return {
        transformation["MetricName"]
        for resource in of_type(resources, "AWS::Logs::MetricFilter").values()
        for transformation in resource["Properties"]["MetricTransformations"]
    }


def alarm_metrics(alarm):
    properties = alarm["Properties"]
    stats = [query["MetricStat"]["Metric"] for query in properties.get("Metrics", []) if "MetricStat" in query]
    return stats or [properties]


@pytest.mark.slow
def test_alarms_watch_metrics_the_code_or_aws_emits(resources):
    from infra.package import MAX_SHARDS, NODE_ALARMS

    alarms = of_type(resources, "AWS::CloudWatch::Alarm")
    watched = {
        name: {f"{m['Namespace']}:{m['MetricName']}" for m in alarm_metrics(alarm)} for name, alarm in alarms.items()
    }
    ours = "VirtualQueue:"
    nodes = {
        f"{kind}Shard{shard}Alarm": {f"AWS/ElastiCache:{metric}"}
        for shard in range(1, MAX_SHARDS + 1)
        for kind, (metric, *_) in NODE_ALARMS.items()
    }
    assert watched == {
        "QueueNearCapacityAlarm": {ours + "QueueFullPercent"},
        "AdmissionBelowTargetAlarm": {ours + "Admitted", ours + "TargetRatePerSec"},
        "PumpStalledAlarm": {ours + "WaitingPolls", ours + "TargetRatePerSec"},
        "PumpThrottledAlarm": {"AWS/Lambda:Throttles", "AWS/Lambda:AsyncEventsDropped"},
        "PumpErrorsAlarm": {ours + "PumpErrors", "AWS/Lambda:Errors"},
        "BypassDeniedAlarm": {ours + "BypassDenied"},
        "RedisDegradedAlarm": {ours + "RedisDegraded"},
        "RedisOutOfMemoryAlarm": {ours + "RedisOutOfMemory"},
        "EventsDroppedAlarm": {ours + "EventsDropped"},
        "SigningKeysUnavailableAlarm": {ours + "SigningKeysUnavailable"},
        "ApiErrorRateAlarm": {"AWS/ApiGateway:Count", "AWS/ApiGateway:5XXError"},
        "ApiLatencyAlarm": {"AWS/ApiGateway:Latency"},
        "ApiFunctionErrorsAlarm": {"AWS/Lambda:Errors", "AWS/Lambda:Throttles"},
        "AuthorizerErrorsAlarm": {"AWS/Lambda:Errors", "AWS/Lambda:Throttles"},
        "GatewayThrottledAlarm": {ours + "GatewayThrottled"},
        "ArrivalsThrottledAlarm": {ours + "ArrivalsThrottled"},
        "WafBlockedAlarm": {"AWS/WAFV2:BlockedRequests"},
        "EvictionSpikeAlarm": {ours + "Evicted", ours + "Admitted"},
        "AccountConcurrencyAlarm": {"AWS/Lambda:ConcurrentExecutions"},
        "AccountThrottlesAlarm": {"AWS/Lambda:Throttles"},
        "FlagSyncErrorsAlarm": {ours + "FlagSyncFailed", "AWS/Lambda:Errors", "AWS/Lambda:Throttles"},
        **nodes,
        "CacheThrottledAlarm": {"AWS/ElastiCache:ThrottledCmds"},
        "CacheDataAlarm": {"AWS/ElastiCache:BytesUsedForCache"},
    }
    from_logs = filed_from_logs(resources)
    for alarm in alarms.values():
        for metric in alarm_metrics(alarm):
            if metric["Namespace"] == "VirtualQueue" and metric["MetricName"] in from_logs:
                assert "Dimensions" not in metric  # a metric filter's, filed without any
            elif metric["Namespace"] == "VirtualQueue":
                assert metric["MetricName"] in emitted_names()
                assert metric["Dimensions"] == [{"Name": "service", "Value": "virtual-queue"}]
            else:
                assert metric["MetricName"] in AWS_METRICS[metric["Namespace"]], metric
        properties = alarm["Properties"]
        assert properties["AlarmActions"] == properties["OKActions"] == [{"Ref": "AlarmTopic"}]
        # Missing data is an idle stack (no sale, no pump tick, no requests): never an alarm, never one at creation.
        assert properties["TreatMissingData"] == "notBreaching"
        assert properties["AlarmDescription"]

    def shape(name):
        p = alarms[name]["Properties"]
        return p["Threshold"], p["ComparisonOperator"], p["EvaluationPeriods"], p.get("DatapointsToAlarm", 1)

    # The thresholds docs/alarms.md justifies.
    assert shape("QueueNearCapacityAlarm") == (90, "GreaterThanThreshold", 1, 1)
    assert shape("AdmissionBelowTargetAlarm") == (0.5, "LessThanThreshold", 3, 3)
    assert shape("PumpStalledAlarm") == (1, "GreaterThanOrEqualToThreshold", 3, 3)
    assert shape("PumpThrottledAlarm") == (1, "GreaterThanOrEqualToThreshold", 1, 1)
    assert shape("ApiErrorRateAlarm") == (1, "GreaterThanThreshold", 3, 3)
    assert shape("ApiLatencyAlarm") == (1000, "GreaterThanThreshold", 3, 3)
    assert alarms["ApiLatencyAlarm"]["Properties"]["ExtendedStatistic"] == "p95"
    assert shape("ApiFunctionErrorsAlarm") == (10, "GreaterThanOrEqualToThreshold", 2, 2)
    assert shape("AuthorizerErrorsAlarm") == (1, "GreaterThanOrEqualToThreshold", 2, 2)
    assert shape("SigningKeysUnavailableAlarm") == (1, "GreaterThanOrEqualToThreshold", 1, 1)
    assert shape("GatewayThrottledAlarm") == (60, "GreaterThanThreshold", 2, 2)
    assert shape("ArrivalsThrottledAlarm") == (600, "GreaterThanThreshold", 5, 5)
    assert shape("WafBlockedAlarm") == (100, "GreaterThanThreshold", 1, 1)
    assert shape("EvictionSpikeAlarm") == (1, "GreaterThanOrEqualToThreshold", 1, 1)
    assert shape("AccountConcurrencyAlarm") == (80, "GreaterThanThreshold", 2, 2)
    assert shape("AccountThrottlesAlarm") == (10, "GreaterThanOrEqualToThreshold", 2, 2)
    assert shape("FlagSyncErrorsAlarm") == (1, "GreaterThanOrEqualToThreshold", 1, 1)
    for shard in range(1, MAX_SHARDS + 1):
        assert shape(f"CacheMemoryShard{shard}Alarm") == (75, "GreaterThanThreshold", 3, 3)
        assert shape(f"CacheEngineCpuShard{shard}Alarm") == (80, "GreaterThanThreshold", 2, 2)  # within 2 minutes
        assert shape(f"CacheReplicationLagShard{shard}Alarm") == (1, "GreaterThanThreshold", 3, 3)
    assert alarms["BypassDeniedAlarm"]["Properties"]["Threshold"] == {"Ref": "BypassDeniedPerMinuteAlarm"}
    assert alarms["RedisDegradedAlarm"]["Properties"]["Threshold"] == 1
    assert alarms["RedisOutOfMemoryAlarm"]["Properties"]["Threshold"] == 1
    # Each function's AWS metrics are its own; the account's carry no dimension at all.
    for name, function in (
        ("PumpThrottledAlarm", "AdmissionPump"),
        ("ApiFunctionErrorsAlarm", "APIHandler"),
        ("AuthorizerErrorsAlarm", "PurchaseAuthorizer"),
    ):
        for metric in alarm_metrics(alarms[name]):
            assert metric["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function}}]
    for metric in alarm_metrics(alarms["FlagSyncErrorsAlarm"]):
        if metric["Namespace"] == "AWS/Lambda":
            assert metric["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "FlagSync"}}]
    for name in ("AccountConcurrencyAlarm", "AccountThrottlesAlarm"):
        assert all("Dimensions" not in metric for metric in alarm_metrics(alarms[name]))
    share = alarms["AccountConcurrencyAlarm"]["Properties"]["Metrics"][-1]["Expression"]["Fn::Sub"]
    assert share == "100 * running / ${AccountConcurrencyQuota}"
    # The web ACL's blocks, every rule's, by the name infra/edge.yaml gives it (no condition: no ACL, no data).
    assert "Condition" not in alarms["WafBlockedAlarm"]
    assert alarms["WafBlockedAlarm"]["Properties"]["Dimensions"] == [
        {"Name": "WebACL", "Value": resources["EdgeWebAcl"]["Properties"]["Name"]},
        {"Name": "Region", "Value": {"Ref": "AWS::Region"}},
        {"Name": "Rule", "Value": "ALL"},
    ]
    # The cache's alarms exist for the cache the stack runs: its nodes (test below), or the serverless cache.
    for name in ("CacheThrottledAlarm", "CacheDataAlarm"):
        assert alarms[name]["Condition"] == "CacheServerless"
        assert alarm_metrics(alarms[name])[0]["Dimensions"] == [
            {"Name": "clusterId", "Value": {"Ref": "ServerlessCache"}}
        ]
    assert shape("CacheThrottledAlarm") == (1, "GreaterThanOrEqualToThreshold", 1, 1)
    assert shape("CacheDataAlarm") == (2**30, "GreaterThanThreshold", 3, 3)


def holds(condition, conditions, parameters):
    """Whether a CloudFormation condition holds for these parameter values (the functions this template uses)."""
    if isinstance(condition, str):
        return holds(conditions[condition], conditions, parameters)
    ((function, arguments),) = condition.items()
    if function == "Condition":
        return holds(arguments, conditions, parameters)
    if function == "Fn::Equals":
        left, right = (str(parameters[a["Ref"]]) if isinstance(a, dict) else str(a) for a in arguments)
        return left == right
    if function == "Fn::Not":
        return not holds(arguments[0], conditions, parameters)
    if function == "Fn::And":
        return all(holds(a, conditions, parameters) for a in arguments)
    if function == "Fn::Or":
        return any(holds(a, conditions, parameters) for a in arguments)
    raise AssertionError(f"no such condition function here: {function}")


@pytest.mark.slow
def test_every_node_of_every_shard_the_cache_can_have_is_watched(template, resources):
    from infra.package import MAX_SHARDS, NODE_ALARMS, NODES_PER_SHARD

    assert template["Parameters"]["CacheShards"]["MaxValue"] == MAX_SHARDS
    assert template["Parameters"]["CacheReplicasPerShard"]["MaxValue"] + 1 == NODES_PER_SHARD
    conditions = template["Conditions"]
    for mode in ("nodes", "serverless"):
        for shards in range(1, MAX_SHARDS + 1):
            parameters = {"CacheMode": mode, "CacheShards": shards}
            for shard in range(1, MAX_SHARDS + 1):
                for kind in NODE_ALARMS:
                    alarm = resources[f"{kind}Shard{shard}Alarm"]
                    # Created exactly for the shards the cache has, and only on nodes.
                    assert holds(alarm["Condition"], conditions, parameters) == (mode == "nodes" and shard <= shards)
                    # ElastiCache files each node's metrics under <group>-<shard>-<node>; the highest counts.
                    watched = [m["Dimensions"] for m in alarm_metrics(alarm)]
                    assert watched == [
                        [{"Name": "CacheClusterId", "Value": {"Fn::Sub": f"${{ReplicationGroup}}-{shard:04}-{n:03}"}}]
                        for n in range(1, NODES_PER_SHARD + 1)
                    ]
                    (expression,) = [q for q in alarm["Properties"]["Metrics"] if "Expression" in q]
                    assert (
                        expression["Expression"]
                        == f"MAX([{', '.join(q['Id'] for q in alarm['Properties']['Metrics'][:-1])}])"
                    )


@pytest.mark.slow
def test_alarms_reach_an_address_when_one_is_given_and_elasticache_tells_the_same_topic(template, resources):
    assert template["Parameters"]["AlarmEmail"]["Default"] == ""
    assert template["Conditions"]["MailAlarms"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmEmail"}, ""]}]}
    mail = resources["AlarmMail"]
    assert mail["Condition"] == "MailAlarms"
    assert mail["Properties"] == {
        "TopicArn": {"Ref": "AlarmTopic"},
        "Protocol": "email",
        "Endpoint": {"Ref": "AlarmEmail"},
    }
    pattern = template["Parameters"]["AlarmEmail"]["AllowedPattern"]
    assert re.fullmatch(pattern, "oncall@shop.example") and re.fullmatch(pattern, "")
    assert not re.fullmatch(pattern, "not an address")
    # Failovers, node replacements and maintenance, from ElastiCache itself.
    assert resources["ReplicationGroup"]["Properties"]["NotificationTopicArn"] == {"Ref": "AlarmTopic"}


@pytest.mark.slow
def test_the_metric_filters_read_fields_the_access_log_writes(resources):
    fmt = resources["RestAPI"]["Properties"]["AccessLogSetting"]["Format"]
    written = set(re.findall(r'"(\w+)":', fmt))
    assert '"responseType":"$context.error.responseType"' in fmt  # THROTTLED on API Gateway's own 429
    for name in ("GatewayThrottledFilter", "ArrivalsThrottledFilter", "GatewayThrottledByRouteFilter"):
        properties = resources[name]["Properties"]
        assert properties["LogGroupName"] == {"Ref": "ApiAccessLogs"}
        assert set(re.findall(r"\$\.(\w+)", properties["FilterPattern"])) <= written
        assert '$.responseType = "THROTTLED"' in properties["FilterPattern"]
    # The arrivals and the rest split the throttled requests between them: enter (POST) and the page, and the others.
    enter, page = "/virtual-queues/{queue_type}/{target_id}/entries", "/waiting-room/{queue_type}/{target_id}"
    for pattern in (resources["GatewayThrottledFilter"], resources["ArrivalsThrottledFilter"]):
        text = pattern["Properties"]["FilterPattern"]
        assert enter in text and page in text and '"POST"' in text
    (by_route,) = resources["GatewayThrottledByRouteFilter"]["Properties"]["MetricTransformations"]
    assert by_route["Dimensions"] == [{"Key": "route", "Value": "$.resource"}, {"Key": "method", "Value": "$.method"}]


def test_the_flag_sync_filter_matches_the_line_flag_sync_logs_when_it_cannot_publish(log_lines):
    from chalicelib.flag_sync import sync

    def broken_store():
        raise redis.ConnectionError("down")

    assert sync({"Type": "PreStartDeployment", "Content": ""}, broken_store, lambda: {}) == {"published": False}
    piece = (ROOT / "infra" / "logs.yaml").read_text()
    (message,) = re.findall(r'FlagSyncFailedFilter:.*?FilterPattern: \'\{ \$\.message = "([^"]+)" \}\'', piece, re.S)
    assert message in [line["message"] for line in log_lines()]


def test_only_the_pump_may_publish_events_to_its_bus_only(template, resources):
    (policy,) = [
        p["Properties"]
        for p in of_type(resources, "AWS::IAM::Policy").values()
        if p["Properties"]["PolicyName"] == "publish-events"
    ]
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert policy["Roles"] == [{"Ref": "AdmissionPumpRole"}]
    assert statement["Action"] == "events:PutEvents"
    own, named = statement["Resource"]["Fn::If"][1:]
    assert own == {"Fn::GetAtt": ["EventBus", "Arn"]} and named["Fn::Sub"].endswith(":event-bus/${EventBusName}")
    # The API writes the outbox, the pump publishes it: both name the same bus (no bus, no events written).
    assert env_of(resources, "APIHandler")["VQ_EVENT_BUS"] == env_of(resources, "AdmissionPump")["VQ_EVENT_BUS"]
    assert template["Parameters"]["EventBusName"]["Default"] == ""  # the stack's own bus unless told
    # The SNS rule for UserAdmitted exists only when asked for.
    assert template["Parameters"]["UserAdmittedTopic"]["Default"] == "off"
    rule = resources["UserAdmittedRule"]
    assert rule["Condition"] == "SendUserAdmitted"
    assert rule["Properties"]["EventPattern"] == {"source": ["virtual-queue"], "detail-type": ["UserAdmitted"]}


def dashboard_body(resources, branch=1):
    """The dashboard's JSON as CloudFormation would render it (`branch` of each Fn::If: 1 the cache's nodes,
    2 the serverless cache), every other ${...} a placeholder."""
    body, variables = resources["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]

    def rendered(value):
        if isinstance(value, dict) and "Fn::Join" in value:
            separator, items = value["Fn::Join"]
            return separator.join(rendered(item) for item in items)
        if isinstance(value, dict) and "Fn::If" in value:
            return rendered(value["Fn::If"][branch])
        if isinstance(value, dict) and "Ref" in value:
            return "${" + value["Ref"] + "}"
        return value["Fn::Sub"] if isinstance(value, dict) else value

    for name, value in variables.items():
        body = body.replace("${" + name + "}", rendered(value))
    return body


@pytest.mark.slow
def test_dashboard_is_valid_json_showing_what_operators_watch_and_every_alarm(resources):
    serverless = dashboard_body(resources, branch=2)
    body = dashboard_body(resources)
    for text in (body, serverless):
        filled = re.sub(r"\$\{(BypassDeniedPerMinuteAlarm|AccountConcurrencyQuota)\}", "50", text)
        dashboard = json.loads(re.sub(r"\$\{[^}]+\}", "x", filled))
    titles = " | ".join(w["properties"]["title"] for w in dashboard["widgets"])
    for topic in (
        "Queue length",
        "Admitted per minute",
        "p95",
        "Entry tokens",
        "Bypass denials",
        "Redis degraded",
        "Lambda errors and throttles",
        "Lambda duration",
        "API 4xx and 5xx",
        "API latency",
        "Pump: starts",
        "Cache: memory",
        "API Gateway 429s by route",
        "WAF: requests blocked",
        "Lambda executions",
        "Edge (CloudFront",
    ):
        assert topic in titles
    shown = set(re.findall(r'"VirtualQueue", "(\w+)"', body)) | set(re.findall(r'MetricName=\\"(\w+)\\"', body))
    others = AWS_METRICS["AWS/ElastiCache"] | AWS_METRICS["AWS/WAFV2"] | filed_from_logs(resources)
    assert {name for name in shown if name[0].isupper()} - emitted_names() <= others
    assert {
        "TokensIssued",
        "TokensConsumed",
        "TokensRestored",
        "WaitSeconds",
        "QueueLength",
        "ConfiguredRatePerSec",
        "EffectiveRatePerSec",
        "WaitingPolls",
        "SigningKeysUnavailable",
    } <= shown
    assert [w["type"] for w in dashboard["widgets"]].count("alarm") == 1
    on_the_widget = set()
    for text in (body, serverless):
        alarm_widget = text.split('"type": "metric"')[0]  # the first widget
        on_the_widget |= set(re.findall(r"\$\{(\w+)\.Arn\}", alarm_widget))
    assert on_the_widget == set(of_type(resources, "AWS::CloudWatch::Alarm"))


def test_waiting_polls_are_added_up_and_filed_at_most_every_interval_the_first_at_once(capsys):
    now = [100.0]
    tally = Tally("WaitingPolls", every_s=30, clock=lambda: now[0])
    for at in (100.0, 101.0, 129.9, 130.0, 131.0):
        now[0] = at
        tally.add()
    filed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["WaitingPolls"] for line in filed] == [1, 3]  # at 100 s, then at 130 s what came since
    assert filed[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["service"]]


def test_a_poll_that_finds_its_user_waiting_feeds_the_pump_stall_signal(room, monkeypatch, capsys):
    monkeypatch.setattr(queue, "WAITING_POLLS", Tally("WaitingPolls"))
    ticket = room.enter(DROP, "1").queue_ticket
    capsys.readouterr()
    assert room.status(DROP, "1", ticket).status == "WAITING"
    assert '"WaitingPolls":1' in capsys.readouterr().out


def test_a_targeted_count_is_filed_per_target_and_for_the_service(capsys):
    count("TokensIssued", DROP)
    count("PumpErrors")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] for line in lines] == [
        [["target", "service"], ["service"]],
        [["service"]],
    ]
    assert (lines[0]["target"], lines[0]["service"], lines[0]["TokensIssued"]) == (
        "limited-drop:42",
        "virtual-queue",
        1,
    )


def test_pump_files_gauges_for_the_service_and_reports_the_rate_it_owes(env, store, capsys):
    env(VQ_TICK_MS=100, VQ_BATCH_SIZE=3, VQ_MAX_WAITING=20)
    room = runtime.waiting_room()
    fast, drained, capped = Target("limited-drop", 43), Target("limited-drop", 44), Target("limited-drop", 45)
    room.configure(fast, parse_config(b'{"batch": 5}'))
    room.configure(capped, parse_config(b'{"maxActive": 1}'))
    for target, users in ((DROP, 10), (fast, 10), (drained, 2), (capped, 10)):
        for user in range(1, users + 1):
            room.enter(target, str(user))
    capsys.readouterr()

    Pump(store, runtime.settings()).tick()

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    gauges = next(line for line in lines if line.get("target") == str(DROP))
    assert gauges["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["target", "service"], ["service"]]
    assert gauges["QueueFullPercent"] == [35.0]  # 7 of 20 still waiting
    # Owed per second: 3 per 100 ms for DROP and 5 for `fast`; nothing for the drained line or the capped one.
    assert [line["TargetRatePerSec"] for line in lines if "TargetRatePerSec" in line] == [80.0]


# --- what the deployed functions read at start-up ---


@mock_aws
def test_flat_signing_key_secret_signs_with_the_active_key_and_verifies_with_all():
    aws.reset()
    client = boto3.client("secretsmanager", region_name="us-east-1")
    client.create_secret(Name="vq/flat", SecretString=json.dumps({"activeKid": "k2", "k1": "s" * 40, "k2": "t" * 40}))
    keyring = load_keyring({"VQ_TOKEN_KEYS_SECRET_ID": "vq/flat"})
    assert keyring.active_kid == "k2" and keyring.secrets == {"k1": b"s" * 40, "k2": b"t" * 40}

    client.put_secret_value(SecretId="vq/flat", SecretString=json.dumps({"activeKid": "k3", "k1": "s" * 40}))
    aws.reset()
    with pytest.raises(ConfigError, match="k3"):
        load_keyring({"VQ_TOKEN_KEYS_SECRET_ID": "vq/flat"})
    aws.reset()


@mock_aws
def test_redis_auth_token_comes_from_secrets_manager(env, own_redis):
    token = "generated/Token+with@odd=characters"
    client = boto3.client("secretsmanager", region_name="us-east-1")
    client.create_secret(Name="vq/redis-auth", SecretString=token)
    connect(own_redis.url).config_set("requirepass", token)
    aws.reset()

    env(REDIS_URL=own_redis.url, VQ_REDIS_CLUSTER="false")
    with pytest.raises(redis.AuthenticationError):
        runtime.waiting_room().store.client.ping()  # without the token the server refuses

    env(VQ_REDIS_AUTH_SECRET_ID="vq/redis-auth")
    assert runtime.waiting_room().enter(DROP, "1").status == "WAITING"
    assert token not in repr(runtime.store().client) and token not in json.dumps(dict(os.environ))

    # A secret that cannot be read is a Redis that cannot be reached: the queue fails open, never a 500.
    env(VQ_REDIS_AUTH_SECRET_ID="vq/absent")
    aws.reset()
    assert runtime.waiting_room().enter(DROP, "2").status == "DIRECT_ADMITTED"
    aws.reset()


@mock_aws
def test_the_auth_token_rotates_without_downtime_as_docs_operations_md_says(env, own_redis):
    """ElastiCache's ROTATE (old and new accepted), the secret updated, then SET (only the new): played with a
    user of two passwords, then one, on a server of the test's own; every call in between answers WAITING."""
    old, new = "old-token-" + "a" * 40, "new-token-" + "b" * 40
    secrets_manager = boto3.client("secretsmanager", region_name="us-east-1")
    secrets_manager.create_secret(Name="vq/redis-auth", SecretString=old)
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("ACL", "SETUSER", "admin", "on", ">admin-password", "~*", "&*", "+@all")
    admin = redis.Redis.from_url(own_redis.url, username="admin", password="admin-password")
    admin.execute_command("ACL", "SETUSER", "default", "resetpass", f">{old}")
    aws.reset()
    env(REDIS_URL=own_redis.url, VQ_REDIS_CLUSTER="false", VQ_REDIS_AUTH_SECRET_ID="vq/redis-auth", VQ_KEYS_MAX_AGE_S=1)
    room = runtime.waiting_room()
    users = iter(range(1, 100))
    assert room.enter(DROP, str(next(users))).status == "WAITING"

    admin.execute_command("ACL", "SETUSER", "default", f">{new}")  # 1. ROTATE: both tokens pass
    secrets_manager.put_secret_value(SecretId="vq/redis-auth", SecretString=new)  # 2. the secret
    assert room.enter(DROP, str(next(users))).status == "WAITING"
    time.sleep(1.1)  # 3. longer than VQ_KEYS_MAX_AGE_S: a connection opened now reads the new token
    admin.execute_command("ACL", "SETUSER", "default", "resetpass", f">{new}")  # 4. SET: only the new one
    admin.execute_command("CLIENT", "KILL", "USER", "default")  # connections made with the old token end
    for _ in range(3):
        assert room.enter(DROP, str(next(users))).status == "WAITING"
    assert room.store.breaker_of(DROP).fail_counter == 0
    aws.reset()


def test_cluster_setting_is_true_or_false():
    assert load_settings({"VQ_TOKEN_KEYS": json.dumps({"k": "s" * 40})}).redis_cluster is False
    with pytest.raises(ConfigError, match="VQ_REDIS_CLUSTER"):
        load_settings({"VQ_TOKEN_KEYS": json.dumps({"k": "s" * 40}), "VQ_REDIS_CLUSTER": "yes"})


@pytest.mark.cluster
def test_cluster_setting_makes_the_runtime_speak_cluster(env, valkey_cluster):
    targets = [Target("limited-drop", n) for n in range(1, 13)]  # spread over the three nodes' slots
    env(REDIS_URL=valkey_cluster.url, VQ_REDIS_CLUSTER="true")
    assert {runtime.waiting_room().enter(target, "1").status for target in targets} == {"WAITING"}
    # A plain client reaches one node only: the others' targets fail (open) with a MOVED answer.
    env(VQ_REDIS_CLUSTER="false")
    assert "DIRECT_ADMITTED" in {runtime.waiting_room().enter(target, "2").status for target in targets}


# --- the edge's distribution (infra/distribution.yaml) ---

CACHING_DISABLED = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"  # CloudFront's managed cache policy CachingDisabled
ALL_VIEWER_EXCEPT_HOST = (
    "b689b0a8-53d0-40ab-baf2-68738e2966ac"  # managed origin request policy AllViewerExceptHostHeader
)


def behaviours(resources):
    """The distribution's behaviours by path pattern, the default under "*"."""
    config = resources["Distribution"]["Properties"]["DistributionConfig"]
    return {b["PathPattern"]: b for b in config["CacheBehaviors"]} | {"*": config["DefaultCacheBehavior"]}


def cache_key(resources, behaviour):
    policy = resources[behaviour["CachePolicyId"]["Ref"]]["Properties"]["CachePolicyConfig"]
    return policy, policy["ParametersInCacheKeyAndForwardedToOrigin"]


@pytest.mark.slow
def test_the_edge_is_on_by_default_in_front_of_a_regional_api(template, resources):
    assert template["Parameters"]["EdgeDistribution"]["Default"] == "on"
    assert template["Conditions"]["EdgeOn"] == {"Fn::Equals": [{"Ref": "EdgeDistribution"}, "on"]}
    edge = [name for name, r in resources.items() if r["Type"].startswith("AWS::CloudFront::")]
    assert {resources[name]["Condition"] for name in edge} == {"EdgeOn"} and "Distribution" in edge
    # An edge-optimized API sits behind a distribution nobody can configure: ours needs a REGIONAL one.
    assert resources["RestAPI"]["Properties"]["EndpointConfiguration"] == "REGIONAL"
    (origin,) = resources["Distribution"]["Properties"]["DistributionConfig"]["Origins"]
    assert origin["DomainName"] == {"Fn::Sub": "${RestAPI}.execute-api.${AWS::Region}.${AWS::URLSuffix}"}
    assert origin["OriginPath"] == {"Fn::Join": ["", ["/", {"Ref": "RestAPI.Stage"}]]}
    assert origin["CustomOriginConfig"]["OriginProtocolPolicy"] == "https-only"
    # Every request from the edge carries the secret the stage's web ACL asks for (tests/test_edge.py).
    assert origin["OriginCustomHeaders"] == [
        {"HeaderName": "X-Origin-Verify", "HeaderValue": {"Fn::Sub": "{{resolve:secretsmanager:${EdgeOriginSecret}}}"}}
    ]
    assert template["Outputs"]["EdgeUrl"]["Condition"] == "EdgeOn"


@pytest.mark.slow
def test_the_line_is_cached_by_its_path_alone_for_what_the_origin_says_within_two_seconds(resources):
    line = behaviours(resources)["/virtual-queues/*/line"]
    assert fnmatch.fnmatchcase("/virtual-queues/limited-drop/42/line", "/virtual-queues/*/line")
    assert line["AllowedMethods"] == ["GET", "HEAD"]
    assert "OriginRequestPolicyId" not in line and "FunctionAssociations" not in line  # nothing more reaches the origin
    policy, key = cache_key(resources, line)
    assert (policy["MinTTL"], policy["DefaultTTL"], policy["MaxTTL"]) == (0, 1, 2)  # the origin's max-age, 1-2 s
    assert key["HeadersConfig"] == {"HeaderBehavior": "none"}
    assert key["CookiesConfig"] == {"CookieBehavior": "none"}
    assert key["QueryStringsConfig"] == {"QueryStringBehavior": "none"}


@pytest.mark.slow
def test_the_page_is_cached_a_few_seconds_per_target_and_language(resources):
    page_behaviour = behaviours(resources)["/waiting-room/*"]
    assert fnmatch.fnmatchcase("/waiting-room/limited-drop/42", "/waiting-room/*")
    assert fnmatch.fnmatchcase("/waiting-room/service-worker.js", "/waiting-room/*")
    assert fnmatch.fnmatchcase("/waiting-room/virtual-queue.min.js", "/waiting-room/*")  # the library the page runs on
    assert page_behaviour["AllowedMethods"] == ["GET", "HEAD"] and page_behaviour["Compress"] is True
    policy, key = cache_key(resources, page_behaviour)
    # Whatever the origin says (the page asks browsers to revalidate every load, with the edge then).
    assert 1 <= policy["MinTTL"] == policy["DefaultTTL"] == policy["MaxTTL"] <= 10
    # The path names the target; the language is the viewer function's, folded into Accept-Language (below).
    assert key["HeadersConfig"] == {"HeaderBehavior": "whitelist", "Headers": ["Accept-Language"]}
    assert key["QueryStringsConfig"] == {"QueryStringBehavior": "none"}
    assert key["CookiesConfig"] == {"CookieBehavior": "none"}
    (association,) = page_behaviour["FunctionAssociations"]
    assert association == {
        "EventType": "viewer-request",
        "FunctionARN": {"Fn::GetAtt": ["EdgeViewerRequest", "FunctionARN"]},
    }


@pytest.mark.slow
def test_every_other_route_is_never_cached_and_gets_every_header_and_the_body(resources):
    per_user = behaviours(resources)["*"]
    assert per_user["CachePolicyId"] == CACHING_DISABLED
    # Authorization (the shop's JWT) can be forwarded only so: never by an origin request policy of one's own.
    # All viewer headers but Host: X-Queue-Ticket, X-Entry-Token, Idempotency-Key, X-User-Id, and the body.
    assert per_user["OriginRequestPolicyId"] == ALL_VIEWER_EXCEPT_HOST
    assert set(per_user["AllowedMethods"]) == {"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "POST", "DELETE"}
    assert per_user["ViewerProtocolPolicy"] == "https-only"  # a redirect would drop a POST's body
    assert per_user["FunctionAssociations"] == behaviours(resources)["/waiting-room/*"]["FunctionAssociations"]
    # Every route of the API but the page's and the line's falls to it: enter, status, leave, purchases, the
    # operators'.
    for path in resources["RestAPI"]["Properties"]["DefinitionBody"]["paths"]:
        concrete = re.sub(r"{[^}]+}", "x", path)
        matching = [p for p in behaviours(resources) if p != "*" and fnmatch.fnmatchcase(concrete, p)]
        public = {
            "/waiting-room/": "/waiting-room/*",
            "/virtual-queues/{queue_type}/{target_id}/line": "/virtual-queues/*/line",
        }
        assert matching == [p for prefix, p in public.items() if path.startswith(prefix)], path
    # No error answer is kept for the next caller of the same path (one user's 404 NOT_IN_QUEUE, 403).
    errors = resources["Distribution"]["Properties"]["DistributionConfig"]["CustomErrorResponses"]
    assert {e["ErrorCode"] for e in errors} >= {400, 403, 404, 405, 414, 500, 501, 502, 503, 504}
    assert all(e == {"ErrorCode": e["ErrorCode"], "ErrorCachingMinTTL": 0} for e in errors)


def viewer_request(resources, requests):
    """What the edge's viewer-request function makes of each request, run by Node.js."""
    code = resources["EdgeViewerRequest"]["Properties"]["FunctionCode"]
    script = code + f"\nconsole.log(JSON.stringify({json.dumps(requests)}.map(handler)));\n"
    result = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def request_for(uri, accept_language=None, lang=None, ip="203.0.113.9"):
    headers = {} if accept_language is None else {"accept-language": {"value": accept_language}}
    return {
        "request": {"uri": uri, "headers": headers, "querystring": {} if lang is None else {"lang": {"value": lang}}},
        "viewer": {"ip": ip},
    }


@pytest.mark.slow
def test_the_viewer_function_picks_the_pages_language_as_the_page_does_and_writes_the_shoppers_address(resources):
    from chalicelib.page import language

    assert shutil.which("node"), "Node.js runs the edge's function here"
    asked = [
        ("ko-KR,ko;q=0.9,en-US;q=0.8", None),
        ("en-US,en;q=0.9,ko;q=0.95", None),
        ("fr-CH, fr;q=0.9, de;q=0.7, *;q=0.5", None),
        ("ko;q=0", None),
        ("KO", None),
        ("en;q=0.5,ko;q=0.5", None),
        ("ko;q=1.000, en;q=1.", None),
        ("  ko  ;  q = 0.8 , en;q=0.7", None),
        ("ko;q=2", None),
        ("zh-Hant-TW;q=0.8,ko-Kore-KR;q=0.9", None),
        (",,,ko", None),
        ("x" * 1200 + ",ko", None),
        (",".join(["de"] * 60 + ["ko"]), None),
        (None, None),
        ("", None),
        ("en", "ko"),
        ("ko", "en"),
        ("ko", "fr"),
        (None, "ko"),
    ]
    requests = [request_for("/waiting-room/limited-drop/42", header, lang) for header, lang in asked]
    answered = viewer_request(resources, requests)
    for (header, lang), request in zip(asked, answered, strict=True):
        assert request["headers"]["accept-language"]["value"] == language(header, lang), (header, lang)
        assert request["headers"]["x-viewer-ip"]["value"] == "203.0.113.9"
    # Elsewhere the language is the app's business; the address is written over whatever the client sent.
    forged = request_for("/virtual-queues/limited-drop/42/entries", "ko")
    forged["request"]["headers"]["x-viewer-ip"] = {"value": "198.51.100.1"}
    (passed,) = viewer_request(resources, [forged])
    assert passed["headers"]["accept-language"]["value"] == "ko"
    assert passed["headers"]["x-viewer-ip"]["value"] == "203.0.113.9"


# --- the network (infra/network.yaml) ---


@pytest.mark.slow
def test_the_network_piece_makes_the_endpoints_and_a_nat_gateway_per_zone_only_when_asked(template, resources):
    assert template["Parameters"]["VpcEndpoints"]["Default"] == "off"
    assert template["Parameters"]["NatPublicSubnetIds"]["Default"] == ""
    endpoints = of_type(resources, "AWS::EC2::VPCEndpoint")
    assert {e["Properties"]["ServiceName"]["Fn::Sub"].rsplit(".", 1)[1] for e in endpoints.values()} == set(
        typing.get_args(aws.Service)
    )
    for endpoint in endpoints.values():
        assert endpoint["Condition"] == "MakeVpcEndpoints"
        properties = endpoint["Properties"]
        assert properties["VpcEndpointType"] == "Interface" and properties["PrivateDnsEnabled"] is True
        assert properties["SubnetIds"] == {"Ref": "SubnetIds"}
        assert properties["SecurityGroupIds"] == [{"Fn::GetAtt": ["EndpointSecurityGroup", "GroupId"]}]
    (ingress,) = resources["EndpointSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["ToPort"], ingress["SourceSecurityGroupId"]) == (
        443,
        443,
        {"Ref": "LambdaSecurityGroupId"},
    )
    # One NAT gateway per zone, each zone's private route table sent to its own: one zone's loss is that zone's.
    gateways = of_type(resources, "AWS::EC2::NatGateway")
    routes = of_type(resources, "AWS::EC2::Route")
    assert len(gateways) == len(routes) == 2
    for zone, (name, gateway) in enumerate(sorted(gateways.items())):
        assert gateway["Condition"] == "MakeNatGateways"
        assert gateway["Properties"]["SubnetId"] == {"Fn::Select": [zone, {"Ref": "NatPublicSubnetIds"}]}
        (route,) = [r["Properties"] for r in routes.values() if r["Properties"]["NatGatewayId"] == {"Ref": name}]
        assert route["RouteTableId"] == {"Fn::Select": [zone, {"Ref": "NatPrivateRouteTableIds"}]}
        assert route["DestinationCidrBlock"] == "0.0.0.0/0"


@pytest.mark.slow
def test_the_alarms_page_names_every_alarm_of_the_stack(resources):
    page = (ROOT / "docs" / "alarms.md").read_text()
    for name in of_type(resources, "AWS::CloudWatch::Alarm"):
        documented = re.sub(r"Shard\d+Alarm$", "ShardNAlarm", name)  # one row for every shard's alarm of a kind
        assert f"| `{documented}`" in page, name
