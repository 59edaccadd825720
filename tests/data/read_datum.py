#!/usr/bin/env python3
"""Reads one serialized Datum with Python's protobuf and prints its fields.

The message class is built at run time from a descriptor written here by hand with the field
numbers of BVLC Caffe's caffe.proto, so the check shares nothing with Cortado's datum.proto
or its generated C++ (tests/data/datum_test.cpp runs it).
"""
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
fdp = descriptor_pb2.FileDescriptorProto(name="caffe_datum_check.proto",
                                         package="caffe_check", syntax="proto2")
msg = fdp.message_type.add(name="Datum")
for name, number, ftype, label in [
        ("channels", 1, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("height", 2, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("width", 3, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("data", 4, F.TYPE_BYTES, F.LABEL_OPTIONAL),
        ("label", 5, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("float_data", 6, F.TYPE_FLOAT, F.LABEL_REPEATED),
        ("encoded", 7, F.TYPE_BOOL, F.LABEL_OPTIONAL)]:
    msg.field.add(name=name, number=number, type=ftype, label=label)
pool = descriptor_pool.DescriptorPool()
pool.Add(fdp)
Datum = message_factory.MessageFactory(pool).GetPrototype(
    pool.FindMessageTypeByName("caffe_check.Datum"))

d = Datum()
with open(sys.argv[1], "rb") as f:
    d.ParseFromString(f.read())
unknown = d.UnknownFields() if hasattr(d, "UnknownFields") else []
if len(unknown):
    sys.exit("unknown fields in the record: %d" % len(unknown))
print("channels=%d height=%d width=%d label=%d encoded=%s data=%s floats=%d" % (
    d.channels, d.height, d.width, d.label, d.encoded, d.data.hex(), len(d.float_data)))
